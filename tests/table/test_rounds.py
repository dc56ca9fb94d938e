"""Every round shape played in process: the real TableApp and store, fake rng and wallet, a fake clock.

The rounds are driven by calling ``step`` and moving the clock, so a round of
any variant takes milliseconds of table work, not its betting window.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from niuniu.table.v1 import events_pb2 as ev
from psycopg_pool import AsyncConnectionPool

from backbone.errors import FailedPrecondition, InvalidArgument
from bull import fairness as fair
from bull.money import JACKPOT_POOL
from bull.variants import VARIANTS, Funding, TableBet
from bull.variants.baibian_bull import FACE_UP, OPEN
from services.table.common import Phase, scoped_id
from tests.table.table_rig import Rig, player, setup_schema

BALANCES = {f"player:p{i}": 10_000_000 for i in range(6)} | {"house": 0, JACKPOT_POOL: 50_000}


@pytest.fixture
async def rig(pool: AsyncConnectionPool) -> Rig:
    return Rig(pool, await setup_schema(pool), BALANCES)


def held(kind: str, who: str, command_id: str, among: Iterable[str]) -> str:
    """The wallet hold of a player's bet or bid ``among`` hold ids: command ids are per player (``scoped_id``)
    and each attempt at a bet or bid has a hold of its own (``<kind>.<id>.<attempt>``); "" when none."""
    prefix = f"{kind}.{scoped_id(f'player:{who}', command_id)}."
    return next((hold_id for hold_id in among if hold_id.startswith(prefix)), "")


def transfer_keys(transfers: Any) -> list[tuple[str, str, str, str, int, str]]:
    return sorted((t.payer, t.payee, str(t.kind), t.bet_id or "", t.amount_minor, t.hold_id) for t in transfers)


async def expected_settlement(rig: Rig, round_row: dict[str, Any], variant_id: str, funding: Funding) -> Any:
    """What the variant settles the round's bets to, from the deck the rng derives for it."""
    variant = VARIANTS[variant_id]
    config = variant.parse_config(round_row["config"])
    deck = fair.shuffle(rig.rng.seed(round_row["round_id"]), round_row["round_id"], "", variant.deck_size)
    bets = [
        TableBet(b["bet_id"], b["player"], b["area"], b["stake_minor"], b["hold_id"])
        for b in await rig.app.round_bets(round_row["round_id"])
        if b["status"] != "cancelled"
    ]
    return variant.settle(variant.deal(deck, config), bets, config, funding)


async def test_a_golden_bull_round_settles_what_the_variant_settles_and_conserves_money(rig: Rig) -> None:
    await rig.create("gb", "golden_bull", {"commission_bps": "500"})
    current = await rig.to_phase("gb", Phase.BETTING)
    for i, area in enumerate(("area_1", "area_2", "area_3", "area_1")):
        await rig.app.place_bet(player(f"p{i}"), f"b{i}", "gb", area, 1_000 * (i + 1))
    cancelled = await rig.app.place_bet(player("p4"), "b4", "gb", "area_2", 500)
    await rig.app.cancel_bet(player("p4"), "gb", cancelled.bet_id)
    ended = await rig.finish("gb")
    assert ended["phase"] == Phase.SETTLED
    settled = await rig.settled(current["round_id"])
    expected = await expected_settlement(rig, ended, "golden_bull", Funding())
    assert transfer_keys(settled.transfers) == transfer_keys(expected.transfers)
    assert not settled.HasField("jackpot_pool_minor")  # only a round that pays from the pool reads it
    assert held("bet", "p4", "b4", settled.hold_ids) and len(settled.bets) == 4
    reveals = (await rig.round_events(current["round_id"]))["table.hand_revealed"]
    assert len(reveals) == 4  # three areas, then the dealer
    assert rig.conserved() and rig.open_holds() == []
    for bet in settled.bets:  # every player's balance moved by exactly their bet's net
        assert rig.wallet.available[bet.player] == 10_000_000 + bet.net_minor
    stored = {b["bet_id"]: b for b in await rig.app.round_bets(current["round_id"])}
    assert {b.bet_id: ("settled", str(b.outcome), b.net_minor) for b in expected.bets} == {
        i: (b["status"], b["outcome"], b["net_minor"]) for i, b in stored.items() if i != cancelled.bet_id
    }
    assert stored[cancelled.bet_id]["status"] == "cancelled"
    await rig.advance("gb", lambda r: r["round_no"] == 2)
    assert (await rig.app.round_row(current["round_id"]))["server_seed"] == rig.rng.seed(current["round_id"]).hex()
    assert await rig.audit("gb", current["round_id"]) == []  # the ledger's recompute, transfer by transfer


async def test_a_bai_buu_round_pays_a_four_of_a_kind_from_the_pool_and_records_the_claim(rig: Rig) -> None:
    await rig.create("bb", "bai_buu", {"jackpot.stake_minor": "100"})
    current = await rig.to_phase("bb", Phase.BETTING)
    # Player 01 (cards 0-3 of the deal convention) holds four kings.
    deck = fair.shuffle(b"x" * 32, "any", "", 52)
    kings = [c.code for c in deck if c.rank == 13]
    rest = [c.code for c in deck if c.rank != 13]
    rig.rng.forced_decks[current["round_id"]] = await four_kings_for_player_01(kings, rest)
    await rig.app.place_bet(player("p0"), "j1", "bb", "jackpot_player_01", 100)
    await rig.app.place_bet(player("p1"), "m1", "bb", "player_01", 2_000)
    ended = await rig.finish("bb")
    assert ended["phase"] == Phase.SETTLED
    settled = await rig.settled(current["round_id"])
    payout = [t for t in settled.transfers if t.payer == JACKPOT_POOL and t.kind == "jackpot_payout"]
    assert payout and payout[0].payee == "player:p0"
    assert settled.jackpot_pool_minor == 50_000
    assert rig.conserved() and rig.open_holds() == []
    assert rig.wallet.available[JACKPOT_POOL] >= 0
    reveals = (await rig.round_events(current["round_id"]))["table.hand_revealed"]
    assert [e.unpack(ev.HandRevealed()).group for e in reveals] == ["head"] * 4 + ["last"] * 4
    # The forced deck is not the one the seed derives: the auditor sees the deal differ.
    assert {f.check for f in await rig.audit("bb", current["round_id"])} == {"recompute.deal"}


async def test_a_pool_payout_topped_up_by_the_house_records_the_pool_and_recomputes_exactly(
    pool: AsyncConnectionPool,
) -> None:
    """The house's top-up to the floor depends on what the pool held: the record carries it for the auditor.

    Seen in a chaos run: the recompute settled a four of a kind on an empty pool and found the
    table's top-up (floor less the pool's share) 20 too small."""
    rig = Rig(pool, await setup_schema(pool), BALANCES | {JACKPOT_POOL: 30})
    table_id = "quads534"  # the fake rng's seed for quads534-r1 deals four of a kind to player_03
    await rig.create(table_id, "bai_buu", {"jackpot.stake_minor": "100"})
    current = await rig.to_phase(table_id, Phase.BETTING)
    await rig.app.place_bet(player("p0"), "j1", table_id, "jackpot_player_03", 100)
    await rig.app.place_bet(player("p1"), "j2", table_id, "jackpot_banker", 100)
    await rig.app.place_bet(player("p2"), "m1", table_id, "player_03", 1_000)
    ended = await rig.finish(table_id)
    assert ended["phase"] == Phase.SETTLED
    settled = await rig.settled(current["round_id"])
    assert settled.HasField("jackpot_pool_minor") and settled.jackpot_pool_minor == 30  # nothing else in flight
    paid = {t.payer: t.amount_minor for t in settled.transfers if t.kind == "jackpot_payout"}
    assert set(paid) == {JACKPOT_POOL, "house"} and paid[JACKPOT_POOL] + paid["house"] == 5_000  # the floor
    assert rig.conserved() and rig.wallet.available[JACKPOT_POOL] >= 0
    assert await rig.audit(table_id, current["round_id"]) == []


async def four_kings_for_player_01(kings: list[str], rest: list[str]) -> list[str]:
    from bull.cards import parse_cards
    from bull.rules import bai_buu as bu

    for deck in ([*kings, *rest], [*rest[:4], *kings, *rest[4:]], [*rest[:8], *kings, *rest[8:]]):
        if bu.deal(parse_cards(deck)).hand("player_01").category == "four_of_a_kind":
            return deck
    raise AssertionError("no deal convention puts four kings on player 01")


async def test_a_baibian_round_is_banked_by_a_player_and_settled_against_them(rig: Rig) -> None:
    await rig.create("bn", "baibian_bull", {"banker.min_capital_minor": "100000"})
    await rig.app.banker.apply(player("p5"), "bn", 1_000_000)
    current = await rig.to_phase("bn", Phase.BETTING)
    with pytest.raises(FailedPrecondition, match="BANKER_CANNOT_BET"):
        await rig.app.place_bet(player("p5"), "x", "bn", "heaven", 100)
    await rig.app.place_bet(player("p0"), "b0", "bn", "heaven", 50_000)
    await rig.app.place_bet(player("p1"), "b1", "bn", "yellow", 40_000)
    with pytest.raises(FailedPrecondition, match="TABLE_CAP_REACHED"):  # capital / 10 = 100 000
        await rig.app.place_bet(player("p2"), "b2", "bn", "earth", 20_000)
    assert not held("bet", "p2", "b2", rig.open_holds())  # the refused bet's hold is released at once
    ended = await rig.finish("bn")
    assert ended["phase"] == Phase.SETTLED
    settled = await rig.settled(current["round_id"])
    banker_hold = f"banker.{current['round_id']}.p5"
    expected = await expected_settlement(rig, ended, "baibian_bull", Funding("player:p5", banker_hold))
    assert transfer_keys(settled.transfers) == transfer_keys(expected.transfers)
    assert all(t.hold_id == banker_hold for t in settled.transfers if t.payer == "player:p5")
    assert banker_hold in settled.hold_ids
    groups = [
        e.unpack(ev.HandRevealed()).group for e in (await rig.round_events(current["round_id"]))["table.hand_revealed"]
    ]
    assert groups == [FACE_UP] * 5 + [OPEN] * 5
    assert rig.conserved() and rig.open_holds() == []
    assert await rig.audit("bn", current["round_id"]) == []


async def test_a_baibian_table_with_nobody_to_bank_refuses_bets_and_still_deals(rig: Rig) -> None:
    await rig.create("nb", "baibian_bull")
    await rig.to_phase("nb", Phase.BETTING)
    with pytest.raises(FailedPrecondition, match="NO_BANKER"):
        await rig.app.place_bet(player("p0"), "b0", "nb", "heaven", 100)
    ended = await rig.finish("nb")
    assert ended["phase"] == Phase.SETTLED and rig.conserved()


async def bid_and_bet(rig: Rig, table_id: str) -> dict[str, Any]:
    current = await rig.to_phase(table_id, Phase.BIDDING)
    await rig.app.envelope.place_bid(player("p0"), "bid-a", table_id, 10_000)
    await rig.app.envelope.place_bid(player("p1"), "bid-b", table_id, 20_000)
    assert rig.wallet.holds[held("bid", "p0", "bid-a", rig.wallet.holds)].status != "open"  # outbid: released
    await rig.to_phase(table_id, Phase.BETTING)
    with pytest.raises(FailedPrecondition, match="DEALER_CANNOT_BET"):
        await rig.app.place_bet(player("p1"), "x", table_id, "dealer", 1_000)
    for i in (2, 3, 4):
        await rig.app.place_bet(player(f"p{i}"), f"e{i}", table_id, "dealer", 1_000)
    with pytest.raises(FailedPrecondition, match="ALREADY_BET"):
        await rig.app.place_bet(player("p2"), "e2-again", table_id, "dealer", 1_000)
    await rig.app.envelope.change_bet(player("p3"), "c3", table_id, "e3", 3_000)
    assert rig.wallet.holds[held("bet", "p3", "e3", rig.wallet.holds)].amount_minor == 3_000 * 18
    await rig.app.envelope.change_bet(player("p4"), "c4", table_id, "e4", 0)  # cancels
    return current


async def test_a_red_envelope_round_bids_bets_grabs_and_settles_with_the_dealer_funded_from_the_bid(
    rig: Rig,
) -> None:
    await rig.create("re", "red_envelope_bull", {"bidding.seconds": "5"})
    current = await bid_and_bet(rig, "re")
    ended = await rig.finish("re")
    if ended["phase"] == Phase.VOIDED:  # the dealer's 0.01 (rare): the round is re-dealt
        assert ended["void_reason"].startswith("DEALER_GRABBED_0.01")
        assert await rig.audit("re", current["round_id"]) == []
        return
    events = await rig.round_events(current["round_id"])
    grabs = [e.unpack(ev.EnvelopeGrabbed()) for e in events["table.envelope_grabbed"]]
    assert sorted(g.position for g in grabs) == [0, 1, 2]  # the dealer and the two remaining bets
    settled = await rig.settled(current["round_id"])
    ids = settled.hold_ids
    assert all(held(*which, ids) for which in [("bid", "p0", "bid-a"), ("bid", "p1", "bid-b"), ("bet", "p4", "e4")])
    dealer_paid = [t for t in settled.transfers if t.payer == "player:p1"]
    assert dealer_paid and all(t.hold_id in (held("bid", "p1", "bid-b", ids), "") for t in dealer_paid)
    assert rig.conserved() and rig.open_holds() == []
    assert await rig.audit("re", current["round_id"]) == []


async def test_the_dealer_grabbing_001_voids_the_round_and_the_next_one_opens_at_once(rig: Rig) -> None:
    await rig.create("rv", "red_envelope_bull", {"bidding.seconds": "5"})
    current = await bid_and_bet(rig, "rv")
    rig.rng.forced_splits[current["round_id"]] = ([1, 500, 499], [0, 1, 2])
    ended = await rig.finish("rv")
    assert ended["phase"] == Phase.VOIDED and ended["void_reason"].startswith("DEALER_GRABBED_0.01")
    voided = await rig.voided(current["round_id"])
    listed = [("bid", "p0", "bid-a"), ("bid", "p1", "bid-b"), ("bet", "p2", "e2"), ("bet", "p3", "e3")]
    assert all(held(*which, voided.hold_ids) for which in listed)
    # The forced split is not the seed's: the auditor sees the shares differ.
    assert {f.check for f in await rig.audit("rv", current["round_id"])} >= {"recompute.split"}
    assert rig.conserved() and rig.open_holds() == []
    await rig.step("rv")  # no pause before a re-deal
    nxt = await rig.current("rv")
    assert nxt["round_no"] == ended["round_no"] + 1 and nxt["phase"] == Phase.BIDDING
    opened = (await rig.round_events(nxt["round_id"]))["table.round_opened"][0].unpack(ev.RoundOpened())
    assert opened.redeal_of == current["round_id"]


async def test_red_envelope_voids_without_a_dealer_without_bets_and_when_the_rng_fails(rig: Rig) -> None:
    await rig.create("rx", "red_envelope_bull", {"bidding.seconds": "5"})
    await rig.to_phase("rx", Phase.BIDDING)
    assert (await rig.finish("rx"))["void_reason"].startswith("NO_DEALER")
    await rig.next_round("rx", Phase.BIDDING)
    await rig.app.envelope.place_bid(player("p0"), "bid-1", "rx", 10_000)
    assert (await rig.finish("rx"))["void_reason"].startswith("NO_BETS")
    await rig.next_round("rx", Phase.BIDDING)
    await rig.app.envelope.place_bid(player("p0"), "bid-2", "rx", 10_000)
    await rig.to_phase("rx", Phase.BETTING)
    await rig.app.place_bet(player("p2"), "e-2", "rx", "dealer", 1_000)
    rig.rng.failures = 100
    ended = await rig.finish("rx")
    assert ended["void_reason"].startswith("ENVELOPE_ERROR")
    rig.rng.failures = 0
    assert rig.conserved() and rig.open_holds() == []


@pytest.mark.parametrize("variant", ["golden_bull", "bai_buu", "baibian_bull", "red_envelope_bull"])
async def test_a_round_survives_a_crash_between_every_step(rig: Rig, variant: str) -> None:
    table_id = variant.replace("_", "-")
    await rig.create(table_id, variant, {"bidding.seconds": "5"} if variant == "red_envelope_bull" else {})
    if variant == "baibian_bull":
        await rig.app.banker.apply(player("p5"), table_id, 0)
    first = "bidding" if variant == "red_envelope_bull" else Phase.BETTING
    current = await rig.to_phase(table_id, first)
    if variant == "red_envelope_bull":
        await rig.app.envelope.place_bid(player("p5"), "bid", table_id, 10_000)
        rig.crash()
        current = await rig.to_phase(table_id, Phase.BETTING)
    area = VARIANTS[variant].areas[0]
    await rig.app.place_bet(player("p0"), "c0", table_id, area, 1_000)
    phases = []
    for _ in range(100):
        row = await rig.app.round_row(current["round_id"])
        phases.append(row["phase"])
        if row["phase"] in Phase.ENDED:
            break
        rig.crash()
        delay = await rig.step(table_id)
        rig.clock.advance(max(delay, 0))
    assert phases[-1] in Phase.ENDED and Phase.REVEALING in phases
    await rig.deliver(table_id)
    assert rig.conserved() and rig.open_holds() == []
    assert await rig.audit(table_id, current["round_id"]) == []


async def test_what_a_bet_gets_wrong_itself_is_answered_whatever_the_window(rig: Rig) -> None:
    """A malformed bet is refused for its mistake in the window, before any round and after the window closed
    alike, and changes nothing; a well-formed one then gets BETTING_CLOSED."""
    limits = {"min_bet_minor": 100, "max_bet_minor": 2_000, "chips_minor": [100, 500]}
    await rig.create("bb", "bai_buu", {"jackpot.stake_minor": "100"}, **limits)
    mistakes = [
        ("jackpot_banker", 200, InvalidArgument, "FIXED_STAKE_REQUIRED"),
        ("player_01", 150, InvalidArgument, "NOT_A_CHIP_AMOUNT"),
        ("player_01", 2_100, FailedPrecondition, "ABOVE_TABLE_MAXIMUM"),
    ]

    async def refused_for_themselves(tag: str) -> None:
        for n, (area, amount, error, reason) in enumerate(mistakes):
            with pytest.raises(error, match=reason):
                await rig.app.place_bet(player("p0"), f"{tag}{n}", "bb", area, amount)

    await refused_for_themselves("before")  # no round yet: the table's terms
    current = await rig.to_phase("bb", Phase.BETTING)
    await refused_for_themselves("open")
    rig.clock.advance(10)  # the window's end, the round not moved on yet
    await refused_for_themselves("late")
    with pytest.raises(FailedPrecondition, match="BETTING_CLOSED"):
        await rig.app.place_bet(player("p0"), "fine", "bb", "player_01", 500)
    assert await rig.app.round_bets(current["round_id"]) == [] and rig.open_holds() == []
