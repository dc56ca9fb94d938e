"""verify-round's recompute step: a round re-dealt and re-settled from its revealed seed (pure)."""

from __future__ import annotations

from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from played_rounds import ROUND, SEED, played_round, revealed_view

from bull import fairness as fair
from bull.money import Settlement
from bull.rules import baibian_bull as bb
from bull.rules import red_envelope as re_
from bull.variants import VARIANTS, EnvelopeSplit, Funding, TableBet
from bull.variants.baibian_bull import FACE_UP, OPEN
from bull.variants.red_envelope_bull import RED_ENVELOPE_BULL, EnvelopeTableConfig
from services.ledger.queries import RoundRecord
from services.ledger.recompute import recompute
from services.ledger.verify import RoundEvidence


def test_an_honest_round_recomputes_cleanly() -> None:
    view, evidence = played_round()
    assert evidence.settlement is not None and len(evidence.settlement.transfers) >= 3
    assert recompute(view, evidence) == []


def test_a_seed_that_does_not_match_the_commitment_is_caught() -> None:
    view, evidence = played_round()
    view.server_seed = bytes(32).hex()
    findings = recompute(view, evidence)
    assert findings and findings[0].check == "recompute.commitment"


def test_a_revealed_hand_the_seed_does_not_deal_is_caught() -> None:
    view, evidence = played_round()
    cards = list(view.hands[0].cards)
    view.hands[0].cards[:] = cards[::-1]  # the same cards in another order are the same hand
    assert recompute(view, evidence) == []
    swapped = "AS" if "AS" not in cards else "2D"
    view.hands[0].cards[0] = swapped
    findings = recompute(view, evidence)
    assert any(f.check == "recompute.deal" and view.hands[0].seat in f.subject for f in findings)


def test_a_settlement_transfer_the_rules_do_not_give_is_caught() -> None:
    view, evidence = played_round()
    assert evidence.settlement is not None
    evidence.settlement.transfers[0].amount_minor += 1
    findings = recompute(view, evidence)
    assert {f.check for f in findings} == {"recompute.settlement"}
    t = evidence.settlement.transfers[0]
    # One to one: the transfer the rules give is missing and the one the table paid is extra.
    assert len(findings) == 2
    assert f"the rules give {t.kind} {t.payer} -> {t.payee} {t.amount_minor - 1}" in findings[0].detail
    assert f"the table paid {t.kind} {t.payer} -> {t.payee} {t.amount_minor}" in findings[1].detail


def test_transfers_that_only_add_up_to_the_rules_totals_are_caught() -> None:
    """Totals per (payer, payee, kind, bet) are not enough: a payment split in two differs from the rules'."""
    view, evidence = played_round()
    assert evidence.settlement is not None
    t = evidence.settlement.transfers[0]
    assert t.amount_minor >= 2
    half = ev.SettlementTransfer()
    half.CopyFrom(t)
    half.amount_minor = t.amount_minor // 2
    t.amount_minor -= half.amount_minor
    evidence.settlement.transfers.append(half)
    findings = recompute(view, evidence)
    assert findings and {f.check for f in findings} == {"recompute.settlement"}


def settled_event(variant: str, settlement: object, transfers: list[ev.SettlementTransfer]) -> ev.RoundSettled:
    return ev.RoundSettled(
        table_id="t1",
        round_id=ROUND,
        variant=variant,
        bets=[
            ev.BetOutcome(bet_id=r.bet_id, player=r.player, area=r.area, stake_minor=r.stake_minor)
            for r in settlement.bets  # type: ignore[attr-defined]
        ],
        transfers=transfers,
    )


def envelope_round(*, pool: int = 10_000, round_id: str = ROUND) -> tuple[table_pb2.RoundView, RoundEvidence]:
    """A red-envelope round as the table settles it: the dealer's payments split at the pool's hold."""
    # The earlier reading of 喝水 (what the losers paid), under which the dealer pays past the pool.
    config = EnvelopeTableConfig.from_settings({"fees.service_minor": "50", "drink_water_base": "paid"})
    split = fair.split_envelope(SEED, round_id, "", 1_000, 4, 1)
    participants = ["player:dealer", "player:a", "player:b", "player:c"]
    stakes = {"player:a": 1_000, "player:b": 500, "player:c": 300}
    bets = [TableBet(f"b{i}", p, "dealer", stakes[p], f"bet.b{i}") for i, p in enumerate(participants) if i]
    seats = ("dealer", *(b.bet_id for b in bets))
    hands = RED_ENVELOPE_BULL.deal(EnvelopeSplit(seats, split.amounts, split.grab_order), config)
    funding = Funding("player:dealer", "bid.x", config.bid_hold_minor(pool), pool)
    settlement = RED_ENVELOPE_BULL.settle(hands, bets, config, funding)
    grabs = [
        ev.EnvelopeGrabbed(
            grab_no=k,
            position=position,
            participant=participants[position],
            amount_minor=amount,
            bet_id=f"b{position}" if position else "",
            dealer=position == 0,
        )
        for k, (amount, position) in enumerate(zip(split.amounts, split.grab_order, strict=True))
    ]
    view = table_pb2.RoundView(
        table_id="t1",
        round_id=round_id,
        commitment=fair.commit(SEED),
        server_seed=SEED.hex(),
        variant=re_.VARIANT_ID,
        config=config.to_settings(),
        dealer="player:dealer",
        dealer_pool_minor=pool,
        grabs=grabs,
        envelope_total_minor=1_000,
    )
    settled = settled_event(re_.VARIANT_ID, settlement, [transfer_event(t) for t in settlement.transfers])
    return view, RoundEvidence.of(RoundRecord(round_id, "settled", settled.SerializeToString(), (), ()))


def transfer_event(t: object) -> ev.SettlementTransfer:
    return ev.SettlementTransfer(
        payer=t.payer,  # type: ignore[attr-defined]
        payee=t.payee,  # type: ignore[attr-defined]
        amount_minor=t.amount_minor,  # type: ignore[attr-defined]
        kind=str(t.kind),  # type: ignore[attr-defined]
        bet_id=t.bet_id or "",  # type: ignore[attr-defined]
        hold_id=t.hold_id,  # type: ignore[attr-defined]
    )


def test_a_red_envelope_round_recomputes_from_its_split_even_with_the_dealer_paying_in_two_parts() -> None:
    view, evidence = envelope_round(pool=100, round_id="t1-r4")  # a small pool: the dealer pays past its hold
    assert evidence.settlement is not None
    assert any(t.payer == "player:dealer" and not t.hold_id for t in evidence.settlement.transfers)
    assert recompute(view, evidence) == []
    view.grabs[0].amount_minor += 1  # a grab the seed does not give
    assert any(f.check == "recompute.split" for f in recompute(view, evidence))


def test_a_red_envelope_settlement_that_differs_from_the_rules_is_caught() -> None:
    view, evidence = envelope_round()
    assert evidence.settlement is not None
    fee = next(t for t in evidence.settlement.transfers if t.kind == "service_fee")
    fee.amount_minor += 1
    findings = recompute(view, evidence)
    assert [f.check for f in findings] == ["recompute.settlement"] * 2
    assert all("service_fee" in f.detail for f in findings)


def test_a_baibian_round_is_settled_against_its_banker() -> None:
    variant = VARIANTS[bb.VARIANT_ID]
    config = variant.parse_config({})
    deck = fair.shuffle(SEED, ROUND, "", 54)
    hands = variant.deal(deck, config)
    bets = [TableBet("b1", "player:a", "heaven", 1_000), TableBet("b2", "player:b", "yellow", 500)]
    banker = "player:bank"
    settlement: Settlement = variant.settle(hands, bets, config, Funding(banker, "banker.x"))
    transfers = [transfer_event(t) for t in settlement.transfers]
    assert all(t.hold_id == "banker.x" for t in transfers if t.payer == banker)
    reveals = [
        ev.HandRevealed(seat=seat, cards=[c.code for c in hand.cards[: 4 if group == FACE_UP else 5]], group=group)
        for group in (FACE_UP, OPEN)
        for seat, hand in hands.items()
    ]
    view = table_pb2.RoundView(
        table_id="t1",
        round_id=ROUND,
        commitment=fair.commit(SEED),
        server_seed=SEED.hex(),
        variant=bb.VARIANT_ID,
        config=variant.config_settings(config),
        hands=reveals,
        dealer=banker,
    )
    settled = settled_event(bb.VARIANT_ID, settlement, transfers)
    evidence = RoundEvidence.of(RoundRecord(ROUND, "settled", settled.SerializeToString(), (), ()))
    assert recompute(view, evidence) == []
    view.dealer = "player:someone-else"
    assert {f.check for f in recompute(view, evidence)} == {"recompute.settlement"}


def test_a_card_round_voided_before_its_deal_checks_only_the_commitment() -> None:
    view, _ = played_round()
    del view.hands[:]  # the rng could not deal: nothing was revealed
    voided = ev.RoundVoided(table_id="t1", round_id=ROUND, reason="the rng service could not deal the round")
    evidence = RoundEvidence.of(RoundRecord(ROUND, "voided", voided.SerializeToString(), (), ()))
    assert recompute(view, evidence) == []
    view.server_seed = bytes(32).hex()
    assert [f.check for f in recompute(view, evidence)] == ["recompute.commitment"]


def pool_round(pool_minor: int) -> tuple[table_pb2.RoundView, ev.RoundSettled]:
    """A Bai Buu round whose seed deals four of a kind to player_03, settled on a pool of ``pool_minor``."""
    round_id = "t1-r5968"
    variant = VARIANTS["bai_buu"]
    config = variant.parse_config({})
    hands = variant.deal(fair.shuffle(SEED, round_id, "", 52), config)
    assert hands["player_03"].category == "four_of_a_kind"
    bets = [
        TableBet("b1", "player:a", "jackpot_player_03", config.jackpot_stake_minor),
        TableBet("b2", "player:b", "jackpot_banker", config.jackpot_stake_minor),
        TableBet("b3", "player:b", "player_03", 1_000),
    ]
    settlement = variant.settle(hands, bets, config, Funding(jackpot_pool_minor=pool_minor))
    settled = settled_event("bai_buu", settlement, [transfer_event(t) for t in settlement.transfers])
    settled.round_id = round_id
    settled.jackpot_pool_minor = pool_minor
    return revealed_view(round_id, "bai_buu", config, hands), settled


def recomputed(view: table_pb2.RoundView, settled: ev.RoundSettled) -> list[str]:
    record = RoundRecord(settled.round_id, "settled", settled.SerializeToString(), (), ())
    return [f.detail for f in recompute(view, RoundEvidence.of(record))]


def test_a_round_that_pays_the_pool_is_re_settled_on_the_pool_its_record_carries() -> None:
    view, settled = pool_round(30)
    payouts = {t.payer: t.amount_minor for t in settled.transfers if t.kind == "jackpot_payout"}
    assert set(payouts) == {"jackpot_pool", "house"}  # the pool's share, and the house's top-up to the floor
    assert recomputed(view, settled) == []

    # The table paid as if the pool held 10: its share and the house's top-up both differ from the rules'.
    _, underpaid = pool_round(10)
    underpaid.jackpot_pool_minor = 30
    details = recomputed(view, underpaid)
    assert len(details) == 4 and all("jackpot_payout" in d for d in details)
    assert any("the table paid jackpot_payout house" in d for d in details)


def test_a_record_without_the_pool_leaves_only_the_pool_dependent_transfers_unchecked() -> None:
    view, settled = pool_round(30)
    settled.ClearField("jackpot_pool_minor")  # written before the record carried it
    assert recomputed(view, settled) == []
    main = next(t for t in settled.transfers if t.bet_id == "b3")
    main.amount_minor += 1
    assert len(recomputed(view, settled)) == 2  # the main bet is still checked
