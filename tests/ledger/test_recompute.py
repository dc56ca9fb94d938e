"""verify-round's recompute step: a round re-dealt and re-settled from its revealed seed (pure)."""

from __future__ import annotations

from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2

from services.ledger.queries import RoundRecord
from services.ledger.recompute import recompute
from services.ledger.verify import RoundEvidence
from services.rng import fair
from services.table.variants import VARIANTS, TableBet

SEED = bytes(range(32))
ROUND = "t1-r7"


def played_round() -> tuple[table_pb2.RoundView, RoundEvidence]:
    variant = VARIANTS["golden_bull"]
    config = variant.parse_config({"commission_bps": "500"})
    deck = fair.shuffle(SEED, ROUND, "", 52)
    hands = variant.deal(deck, config)
    bets = [
        TableBet("b1", "player:a", "area_1", 1_000),
        TableBet("b2", "player:b", "area_2", 500),
        TableBet("b3", "player:a", "area_3", 300),
    ]
    settlement = variant.settle(hands, bets, config)
    settled = ev.RoundSettled(
        table_id="t1",
        round_id=ROUND,
        variant="golden_bull",
        bets=[
            ev.BetOutcome(bet_id=r.bet_id, player=r.player, area=r.area, stake_minor=r.stake_minor)
            for r in settlement.bets
        ],
        transfers=[
            ev.SettlementTransfer(
                payer=t.payer, payee=t.payee, amount_minor=t.amount_minor, kind=str(t.kind), bet_id=t.bet_id or ""
            )
            for t in settlement.transfers
        ],
    )
    view = table_pb2.RoundView(
        table_id="t1",
        round_id=ROUND,
        commitment=fair.commit(SEED),
        server_seed=SEED.hex(),
        variant="golden_bull",
        config=variant.config_settings(config),
        hands=[ev.HandRevealed(seat=seat, cards=[c.code for c in hand.cards]) for seat, hand in hands.items()],
    )
    record = RoundRecord(ROUND, "settled", settled.SerializeToString(), (), ())
    return view, RoundEvidence.of(record)


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
    assert len(findings) == 1  # one (payer, payee, kind, bet) whose total differs, both totals named
    t = evidence.settlement.transfers[0]
    assert f"the table paid {t.amount_minor}" in findings[0].detail
    assert f"the rules give {t.amount_minor - 1}" in findings[0].detail
