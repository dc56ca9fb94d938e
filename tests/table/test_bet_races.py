"""Races between a player's own commands, each named after what it once broke: a bet and its hold must change
together or not at all, whatever arrives twice or at the same moment.

The wallet here is the in-process fake (``FakeWallet``), which answers a repeated PlaceHold with the hold as
it is, voided or not, as the real wallet does; the same races run on the real stack in
``tests/e2e/test_bet_histories_e2e.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from backbone.errors import DomainError, FailedPrecondition
from services.table.common import Phase, bet_stream, player_account, scoped_id
from tests.table.table_rig import Rig, player, setup_schema

BALANCES = {f"player:p{i}": 10_000_000 for i in range(6)} | {"house": 0}


@pytest.fixture
async def rig(pool: AsyncConnectionPool) -> Rig:
    return Rig(pool, await setup_schema(pool), BALANCES)


def during(wallet_call: Callable[..., Awaitable[None]], meanwhile: Callable[[], Awaitable[Any]]) -> Any:
    """``wallet_call`` that runs ``meanwhile`` once, right after its first call has done its work."""
    pending = [meanwhile]

    async def call(*args: Any) -> None:
        await wallet_call(*args)
        if pending:
            await pending.pop()()

    return call


async def bet_row(rig: Rig, table_id: str, command_id: str, who: str = "p1") -> dict[str, Any]:
    current = await rig.current(table_id)
    bet_id = scoped_id(player_account(player(who)), command_id)
    return next(b for b in await rig.app.round_bets(current["round_id"]) if b["bet_id"] == bet_id)


async def test_a_placebet_refused_after_its_hold_and_sent_again_is_recorded_with_a_live_hold(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retried refused PlaceBet: refused after the wallet held it (the player's other bet took the room under
    the table maximum meanwhile), then sent again with the same command id once there is room. It used to be
    recorded on the voided hold of its first attempt, and the wallet refused the whole round's settlement."""
    await rig.create("gb", "golden_bull", max_bet_minor=1_000)
    await rig.to_phase("gb", Phase.BETTING)
    other = lambda: rig.app.place_bet(player("p1"), "other", "gb", "area_2", 1_000)  # noqa: E731
    monkeypatch.setattr(rig.wallet, "place_hold", during(rig.wallet.place_hold, other))
    with pytest.raises(FailedPrecondition, match="ABOVE_TABLE_MAXIMUM"):
        await rig.app.place_bet(player("p1"), "first", "gb", "area_1", 500)
    await rig.app.cancel_bet(player("p1"), "gb", "other")
    receipt = await rig.app.place_bet(player("p1"), "first", "gb", "area_1", 500)
    assert not receipt.replayed
    bet = await bet_row(rig, "gb", "first")
    assert bet["hold_id"] == receipt.hold_id and rig.wallet.holds[receipt.hold_id].status == "open"
    assert rig.wallet.holds[receipt.hold_id].amount_minor == bet["hold_minor"]
    assert [h.status for h in rig.wallet.bet_holds(bet["bet_id"])].count("voided") == 1  # the refused attempt's
    assert (await rig.finish("gb"))["phase"] == Phase.SETTLED
    assert rig.conserved() and rig.open_holds() == []


async def test_the_same_placebet_sent_twice_at_once_is_recorded_once_and_holds_once(rig: Rig) -> None:
    await rig.create("gb", "golden_bull")
    await rig.to_phase("gb", Phase.BETTING)
    first, second = await asyncio.gather(
        *(rig.app.place_bet(player("p1"), "twice", "gb", "area_1", 500) for _ in range(2))
    )
    assert sorted([first.replayed, second.replayed]) == [False, True]
    assert first.hold_id == second.hold_id == (await bet_row(rig, "gb", "twice"))["hold_id"]
    assert rig.open_holds() == [first.hold_id]


async def test_two_cancels_of_one_bet_cancel_it_once_and_give_its_stake_back_once(rig: Rig) -> None:
    """The double cancel: two CancelBet of one bet at the same moment both succeeded, each appended a
    BetCancelled and gave the stake back to the 百變 table cap's counter (which went below zero)."""
    await rig.create("bn", "baibian_bull", {"banker.min_capital_minor": "100000"})
    await rig.app.banker.apply(player("p5"), "bn", 1_000_000)
    current = await rig.to_phase("bn", Phase.BETTING)
    await rig.app.place_bet(player("p0"), "kept", "bn", "earth", 20_000)
    await rig.app.place_bet(player("p1"), "b", "bn", "heaven", 30_000)
    receipts = await asyncio.gather(*(rig.app.cancel_bet(player("p1"), "bn", "b") for _ in range(3)))
    assert sorted(r.replayed for r in receipts) == [False, True, True]
    assert all(r.status == "cancelled" for r in receipts)
    bet = await bet_row(rig, "bn", "b")
    events = await rig.round_events(current["round_id"])
    assert [e.stream_id for e in events.get("table.bet_cancelled", [])] == [bet_stream("bn", bet["bet_id"])]
    async with rig.pool.connection() as conn:
        cur = await conn.execute("SELECT staked_minor FROM banked_rounds WHERE round_id = %s", (current["round_id"],))
        assert await cur.fetchone() == (20_000,)  # the live stakes
    assert rig.wallet.holds[bet["hold_id"]].status == "voided"


async def test_two_changes_of_one_bet_from_one_reading_leave_the_hold_covering_the_recorded_stake(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ChangeBet race: a change to 20 000 and, a moment later, one to 200 of a 100 bet. Each used to resize
    the wallet's hold to its own amount before its transaction; the transaction refused the change that lost,
    but the wallet kept its resize: the table recorded 20 000 held at 18 x 200. Now the change whose wallet
    resize comes second finds the hold changed and is refused, and the wallet holds what the table records."""
    await rig.create("re", "red_envelope_bull", {"bidding.seconds": "5"})
    await rig.to_phase("re", Phase.BIDDING)
    await rig.app.envelope.place_bid(player("p0"), "bid", "re", 100_000)
    await rig.to_phase("re", Phase.BETTING)
    await rig.app.place_bet(player("p1"), "e1", "re", "dealer", 100)
    outcomes: list[Any] = []

    async def small_meanwhile() -> None:  # the second change reads and resizes between the first's two steps
        try:
            outcomes.append(await rig.app.envelope.change_bet(player("p1"), "down", "re", "e1", 200))
        except DomainError as refused:
            outcomes.append(refused)

    monkeypatch.setattr(rig.wallet, "resize_hold", during(rig.wallet.resize_hold, small_meanwhile))
    big = await rig.app.envelope.change_bet(player("p1"), "up", "re", "e1", 20_000)
    assert big.stake_minor == 20_000
    assert [getattr(o, "reason", "changed") for o in outcomes] == ["CHANGE_CONFLICT"]
    bet = await bet_row(rig, "re", "e1")
    assert (bet["stake_minor"], bet["hold_minor"]) == (20_000, 20_000 * 18)
    assert rig.wallet.holds[bet["hold_id"]].amount_minor == bet["hold_minor"]
    assert (await rig.finish("re"))["phase"] in (Phase.SETTLED, Phase.VOIDED)
    assert rig.conserved() and rig.open_holds() == []


async def test_a_change_the_table_refuses_after_the_wallet_grew_the_hold_leaves_the_hold_as_it_was(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    await rig.create("re", "red_envelope_bull", {"bidding.seconds": "5"})
    await rig.to_phase("re", Phase.BIDDING)
    await rig.app.envelope.place_bid(player("p0"), "bid", "re", 100_000)
    await rig.to_phase("re", Phase.BETTING)
    await rig.app.place_bet(player("p1"), "e1", "re", "dealer", 100)
    cancel = lambda: rig.app.cancel_bet(player("p1"), "re", "e1")  # noqa: E731
    monkeypatch.setattr(rig.wallet, "resize_hold", during(rig.wallet.resize_hold, cancel))
    with pytest.raises(FailedPrecondition, match="BET_NOT_OPEN"):
        await rig.app.envelope.change_bet(player("p1"), "up", "re", "e1", 1_000)
    bet = await bet_row(rig, "re", "e1")
    assert (bet["status"], bet["stake_minor"]) == ("cancelled", 100)
    assert rig.wallet.holds[bet["hold_id"]].status == "voided"
    assert [h for h in rig.open_holds() if h.startswith("bet.")] == []
    assert rig.conserved()
