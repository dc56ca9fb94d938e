"""PlaceBets: several bets of one player in one call, each decided alone, recorded in the order sent.

The real TableApp and store (PostgreSQL), a fake wallet and clock (``table_rig``).
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY
from psycopg_pool import AsyncConnectionPool

from backbone.auth import Principal, Role
from backbone.errors import DomainError, FailedPrecondition, InvalidArgument, PermissionDenied
from services.table import bets as bets_module
from services.table.bets import MAX_BETS_PER_CALL, BetOrder
from services.table.common import BetReceipt, Phase, player_account, scoped_id
from tests.table.table_rig import Rig, player, setup_schema

BALANCES = {"player:p1": 1_000_000, "player:poor": 1_000, "house": 0}


@pytest.fixture
async def rig(pool: AsyncConnectionPool) -> Rig:
    rig = Rig(pool, await setup_schema(pool), BALANCES)
    await rig.create("pb", "golden_bull", min_bet_minor=100, max_bet_minor=2_000, chips_minor=[100])
    await rig.to_phase("pb", Phase.BETTING)
    return rig


def refused_in_calls(reason: str) -> float:
    return REGISTRY.get_sample_value("niuniu_table_called_bets_refused_total", {"reason": reason}) or 0.0


def reasons(outcomes: list[BetReceipt | DomainError]) -> list[str]:
    return [o.reason if isinstance(o, DomainError) else o.status for o in outcomes]


async def test_each_bet_of_a_call_gets_its_own_outcome_in_the_order_sent(rig: Rig) -> None:
    """One call: a bet, a bet asked again, an unknown area, a bet past the table maximum, a malformed command id.
    The outcomes come back in order; only the placed bet holds money; the refusals are counted by reason."""
    first = await rig.app.place_bets(player("p1"), [BetOrder("one", "pb", "area_1", 500)])
    assert reasons(first) == ["placed"]
    before = {r: refused_in_calls(r) for r in ("AREA_UNKNOWN", "ABOVE_TABLE_MAXIMUM", "COMMAND_ID_MALFORMED")}
    orders = [
        BetOrder("two", "pb", "area_2", 1_000),
        BetOrder("one", "pb", "area_1", 500),  # asked again: the same receipt
        BetOrder("three", "pb", "area_9", 100),
        BetOrder("four", "pb", "area_3", 2_100),
        BetOrder("five!", "pb", "area_3", 100),
    ]
    outcomes = await rig.app.place_bets(player("p1"), orders)
    assert reasons(outcomes) == ["placed", "placed", "AREA_UNKNOWN", "ABOVE_TABLE_MAXIMUM", "COMMAND_ID_MALFORMED"]
    placed, again = outcomes[0], outcomes[1]
    assert isinstance(placed, BetReceipt) and not placed.replayed and placed.area == "area_2"
    assert isinstance(again, BetReceipt) and again.replayed and again.bet_id == first[0].bet_id  # type: ignore[union-attr]
    assert [type(o).__name__ for o in outcomes[2:]] == ["InvalidArgument", "FailedPrecondition", "InvalidArgument"]
    for reason, count in before.items():
        assert refused_in_calls(reason) == count + 1, reason
    bets = await rig.app.round_bets((await rig.current("pb"))["round_id"])
    assert sorted(b["stake_minor"] for b in bets) == [500, 1_000]
    assert sorted(rig.open_holds()) == sorted(b["hold_id"] for b in bets)


async def test_when_the_maximum_leaves_room_for_some_the_earlier_bets_get_it(rig: Rig) -> None:
    """Under a maximum of 2 000, bets of 1 500 then 1 000 in one call: the first sent is placed and the second
    refused, although its bet id sorts first (the recording follows the order sent, not the ids)."""
    orders = [BetOrder("first", "pb", "area_1", 1_500), BetOrder("second", "pb", "area_2", 1_000)]
    account = player_account(player("p1"))
    assert scoped_id(account, "first") > scoped_id(account, "second")
    outcomes = await rig.app.place_bets(player("p1"), orders)
    assert reasons(outcomes) == ["placed", "ABOVE_TABLE_MAXIMUM"]
    assert [b["stake_minor"] for b in await rig.app.round_bets((await rig.current("pb"))["round_id"])] == [1_500]
    assert len(rig.open_holds()) == 1


async def test_a_full_round_refuses_one_bet_more_and_releases_its_hold(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round takes MAX_BETS_PER_ROUND bets (here 3), every player's and cancelled ones too: one more is refused
    FAILED_PRECONDITION ROUND_FULL, its hold released when the round filled while the wallet held it, and no hold
    asked for at all once the round is seen full; a bet the round took is still answered when asked again."""
    monkeypatch.setattr(bets_module, "MAX_BETS_PER_ROUND", 3)
    before = refused_in_calls("ROUND_FULL")
    first = await rig.app.place_bets(player("p1"), [BetOrder("a", "pb", "area_1", 100)])
    await rig.app.cancel_bet(player("p1"), "pb", first[0].bet_id)  # type: ignore[union-attr]
    orders = [BetOrder(f"b{i}", "pb", "area_2", 100) for i in range(3)]
    outcomes = await rig.app.place_bets(player("p1"), orders)
    assert reasons(outcomes) == ["placed", "placed", "ROUND_FULL"]
    assert isinstance(outcomes[2], FailedPrecondition)  # answered FAILED_PRECONDITION
    assert refused_in_calls("ROUND_FULL") == before + 1
    account = player_account(player("p1"))
    assert [h.status for h in rig.wallet.bet_holds(scoped_id(account, "b2"))] == ["voided"]  # filled while held
    again = await rig.app.place_bets(
        player("p1"), [BetOrder("b0", "pb", "area_2", 100), BetOrder("c", "pb", "area_3", 100)]
    )
    assert isinstance(again[0], BetReceipt) and again[0].replayed
    assert reasons(again)[1] == "ROUND_FULL" and not rig.wallet.bet_holds(scoped_id(account, "c"))
    assert refused_in_calls("ROUND_FULL") == before + 2
    bets = await rig.app.round_bets((await rig.current("pb"))["round_id"])
    assert sorted(b["status"] for b in bets) == ["cancelled", "placed", "placed"]
    assert sorted(rig.open_holds()) == sorted(b["hold_id"] for b in bets if b["status"] == "placed")


async def test_a_player_who_has_placed_their_share_of_a_round_is_refused_and_the_others_still_bet(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A player places at most MAX_BETS_PER_PLAYER_ROUND bets in a round (here 3), cancelled ones too, so
    betting and cancelling cannot fill the round: one more is refused FAILED_PRECONDITION PLAYER_ROUND_FULL,
    its hold released when the share filled while the wallet held it, and no hold asked for once the share
    is seen full; another player bets as before."""
    monkeypatch.setattr(bets_module, "MAX_BETS_PER_PLAYER_ROUND", 3)
    before = refused_in_calls("PLAYER_ROUND_FULL")
    first = await rig.app.place_bets(player("p1"), [BetOrder("a", "pb", "area_1", 100)])
    await rig.app.cancel_bet(player("p1"), "pb", first[0].bet_id)  # type: ignore[union-attr]
    outcomes = await rig.app.place_bets(player("p1"), [BetOrder(f"b{i}", "pb", "area_2", 100) for i in range(3)])
    assert reasons(outcomes) == ["placed", "placed", "PLAYER_ROUND_FULL"]
    assert isinstance(outcomes[2], FailedPrecondition)
    account = player_account(player("p1"))
    assert [h.status for h in rig.wallet.bet_holds(scoped_id(account, "b2"))] == ["voided"]  # filled while held
    again = await rig.app.place_bets(player("p1"), [BetOrder("c", "pb", "area_3", 100)])
    assert reasons(again) == ["PLAYER_ROUND_FULL"] and not rig.wallet.bet_holds(scoped_id(account, "c"))
    assert refused_in_calls("PLAYER_ROUND_FULL") == before + 2
    other = await rig.app.place_bets(player("poor"), [BetOrder("d", "pb", "area_1", 100)])
    assert reasons(other) == ["placed"]  # the round itself has room (2 048)
    bets = await rig.app.round_bets((await rig.current("pb"))["round_id"])
    assert sorted((b["player"], b["status"]) for b in bets) == sorted(
        [(account, "cancelled"), (account, "placed"), (account, "placed"), (player_account(player("poor")), "placed")]
    )


async def test_a_round_begun_before_its_bets_were_counted_is_counted_from_its_bets(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round whose count row is missing (its bets recorded before the count was kept): the recording counts
    its bets instead, then keeps the count from there."""
    monkeypatch.setattr(bets_module, "MAX_BETS_PER_ROUND", 3)
    placed = await rig.app.place_bets(player("p1"), [BetOrder(f"a{i}", "pb", "area_1", 100) for i in range(2)])
    assert reasons(placed) == ["placed", "placed"]
    round_id = (await rig.current("pb"))["round_id"]
    async with rig.pool.connection() as conn:
        await conn.execute("DELETE FROM round_bet_counts WHERE round_id = %s", (round_id,))
    outcomes = await rig.app.place_bets(player("p1"), [BetOrder("b", "pb", "area_2", 100)])
    assert reasons(outcomes) == ["placed"]  # read as 0 taken, recorded as the third
    async with rig.pool.connection() as conn:
        cur = await conn.execute("SELECT bets FROM round_bet_counts WHERE round_id = %s", (round_id,))
        assert await cur.fetchone() == (3,)
    full = await rig.app.place_bets(player("p1"), [BetOrder("c", "pb", "area_3", 100)])
    assert reasons(full) == ["ROUND_FULL"]


async def test_a_bet_short_of_funds_is_refused_and_the_others_are_placed(rig: Rig) -> None:
    """The wallet's refusal of one hold (INSUFFICIENT_FUNDS) is that bet's outcome only."""
    outcomes = await rig.app.place_bets(
        player("poor"), [BetOrder("a", "pb", "area_1", 100), BetOrder("b", "pb", "area_2", 1_000)]
    )
    assert reasons(outcomes) == ["placed", "INSUFFICIENT_FUNDS"]
    assert rig.wallet.available[player_account(player("poor"))] == 1_000 - outcomes[0].hold_minor  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("orders", "reason"),
    [
        ([], "BETS_COUNT"),
        ([BetOrder(f"c{n}", "pb", "area_1", 100) for n in range(MAX_BETS_PER_CALL + 1)], "BETS_COUNT"),
        ([BetOrder("same", "pb", "area_1", 100), BetOrder("same", "pb", "area_2", 100)], "COMMAND_ID_REPEATED"),
    ],
    ids=["none", "too-many", "repeated-id"],
)
async def test_a_call_refused_as_a_whole_places_nothing(rig: Rig, orders: list[BetOrder], reason: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        await rig.app.place_bets(player("p1"), orders)
    assert refused.value.reason == reason
    assert await rig.app.round_bets((await rig.current("pb"))["round_id"]) == []
    assert rig.open_holds() == []


async def test_only_players_place_bets(rig: Rig) -> None:
    with pytest.raises(PermissionDenied):
        await rig.app.place_bets(Principal("auditor", Role.AUDITOR), [BetOrder("a", "pb", "area_1", 100)])


async def test_a_failure_that_is_no_refusal_fails_the_call_and_asking_again_replays_the_placed(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One bet's hold breaks with an error that is not a refusal: the call fails once every bet is decided (the
    other is placed, not left half way); asked again with the same command ids, it is answered as replayed."""
    place_hold = rig.wallet.place_hold
    broken = f"bet.{scoped_id(player_account(player('p1')), 'b')}."

    async def broken_for_b(hold_id: str, *args: Any) -> None:
        if hold_id.startswith(broken):
            raise RuntimeError("the wallet port broke")
        await place_hold(hold_id, *args)

    monkeypatch.setattr(rig.wallet, "place_hold", broken_for_b)
    orders = [BetOrder("a", "pb", "area_1", 100), BetOrder("b", "pb", "area_2", 100)]
    with pytest.raises(RuntimeError):
        await rig.app.place_bets(player("p1"), orders)
    assert [b["area"] for b in await rig.app.round_bets((await rig.current("pb"))["round_id"])] == ["area_1"]
    monkeypatch.setattr(rig.wallet, "place_hold", place_hold)
    outcomes = await rig.app.place_bets(player("p1"), orders)
    assert [(o.status, o.replayed) for o in outcomes if isinstance(o, BetReceipt)] == [
        ("placed", True),
        ("placed", False),
    ]
