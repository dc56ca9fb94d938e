"""Bets recorded together: concurrent PlaceBet calls share one transaction, each keeps its own outcome.

The real TableApp and store (PostgreSQL), a fake wallet and clock (``table_rig``).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from psycopg_pool import AsyncConnectionPool

from backbone.errors import FailedPrecondition
from services.table.admission import Bounds
from services.table.common import Phase, bet_stream, player_account, scoped_id
from services.table.recording import Recording
from services.table.store import BetQuery
from tests.table.table_rig import Rig, player, setup_schema

PLAYERS = 8
BALANCES = {f"player:p{i}": 1_000_000 for i in range(PLAYERS)} | {"house": 0}


@pytest.fixture
async def rig(pool: AsyncConnectionPool) -> Rig:
    rig = Rig(pool, await setup_schema(pool), BALANCES)
    await rig.create("gb-a", "golden_bull", betting_seconds=10)
    await rig.create("gb-b", "golden_bull", betting_seconds=60)
    await rig.to_phase("gb-a", Phase.BETTING)
    await rig.to_phase("gb-b", Phase.BETTING)
    return rig


def groups() -> tuple[float, float]:
    """How many bet groups were recorded so far, and how many bets they held."""
    count = REGISTRY.get_sample_value("niuniu_table_bet_group_size_count") or 0.0
    total = REGISTRY.get_sample_value("niuniu_table_bet_group_size_sum") or 0.0
    return count, total


def a_bet(rounds: dict[str, Any], who: str, command_id: str, table_id: str, stake: int) -> dict[str, Any]:
    account = player_account(player(who))
    bet_id = scoped_id(account, command_id)
    return {
        "bet_id": bet_id,
        "round_id": rounds[table_id]["round_id"],
        "table_id": table_id,
        "player": account,
        "area": "area_1",
        "stake_minor": stake,
        "hold_minor": stake,
        "hold_id": f"bet.{bet_id}",
    }


async def test_bets_placed_at_once_at_two_tables_are_recorded_in_fewer_transactions_each_with_its_event(
    rig: Rig,
) -> None:
    groups_before, bets_before = groups()
    calls = [
        rig.app.place_bet(player(f"p{i}"), f"c{i}-{table}", table, area, 100 * (i + 1))
        for i in range(PLAYERS)
        for table, area in (("gb-a", "area_1"), ("gb-b", "area_2"))
    ]
    receipts = await asyncio.gather(*calls)
    assert [r.status for r in receipts] == ["placed"] * len(calls) and not any(r.replayed for r in receipts)
    groups_after, bets_after = groups()
    assert bets_after - bets_before == len(calls)
    assert groups_after - groups_before < len(calls)  # some bets shared a transaction
    for table_id in ("gb-a", "gb-b"):
        round_id = (await rig.current(table_id))["round_id"]
        bets = await rig.app.round_bets(round_id)
        assert sorted(b["player"] for b in bets) == sorted(player_account(player(f"p{i}")) for i in range(PLAYERS))
        async with rig.pool.connection() as conn:
            for bet in bets:  # each bet's own stream, its one BetPlaced
                assert await rig.events.stream_version(conn, bet_stream(table_id, bet["bet_id"])) == 1
    assert sorted(rig.open_holds()) == sorted(r.hold_id for r in receipts)


async def test_a_group_answers_each_bet_for_itself_closed_raced_or_recorded(rig: Rig) -> None:
    """One transaction: a bet past its table's window writes nothing, a bet already recorded is reported as
    such, and the others are recorded, whatever order they came in."""
    rounds = {t: (await rig.current(t)) for t in ("gb-a", "gb-b")}
    late = rounds["gb-a"]["betting_closes_at"] + timedelta(seconds=1)  # gb-b's window is still open then
    first = await rig.app.place_bet(player("p0"), "first", "gb-b", "area_1", 100)

    recordings = [
        Recording(a_bet(rounds, "p1", "x", "gb-b", 100), late, "", Bounds(10_000, 2_048, 128)),
        Recording(a_bet(rounds, "p2", "y", "gb-a", 100), late, "", Bounds(10_000, 2_048, 128)),  # past gb-a's window
        Recording(a_bet(rounds, "p0", "first", "gb-b", 100), late, "", Bounds(10_000, 2_048, 128)),  # recorded before
        Recording(a_bet(rounds, "p3", "z", "gb-a", 100), rig.clock(), "", Bounds(10_000, 2_048, 128)),
    ]
    outcomes = await rig.app.bets.groups.record_group(recordings)
    assert [o.inserted for o in outcomes] == [True, False, False, True]
    assert [o.window is not None and o.window[0] == Phase.BETTING for o in outcomes] == [True] * 4
    placed = {b["bet_id"] for t in rounds.values() for b in await rig.app.round_bets(t["round_id"])}
    assert placed == {first.bet_id, recordings[0].bet["bet_id"], recordings[3].bet["bet_id"]}

    rig.clock.advance((late - rig.clock()).total_seconds())  # and through PlaceBet: gb-a's window closed
    with pytest.raises(FailedPrecondition, match="BETTING_CLOSED"):
        await rig.app.place_bet(player("p4"), "w", "gb-a", "area_1", 100)


async def test_one_read_answers_each_bet_with_its_own_table_round_stakes_and_stored_bets(rig: Rig) -> None:
    """The checks' read for a group: four statements whatever its size, each bet's answer its own."""
    p1, p2 = player_account(player("p1")), player_account(player("p2"))
    placed = [
        await rig.app.place_bet(player("p1"), "a1", "gb-a", "area_1", 300),
        await rig.app.place_bet(player("p1"), "a2", "gb-a", "area_2", 200),
        await rig.app.place_bet(player("p1"), "b1", "gb-b", "area_1", 700),
        await rig.app.place_bet(player("p2"), "b2", "gb-b", "area_1", 100),
    ]
    queries = [
        BetQuery("gb-a", (scoped_id(p1, "new"), "new"), p1),
        BetQuery("gb-b", (placed[2].bet_id, "b1"), p1),
        BetQuery("gb-a", (scoped_id(p2, "new"), "new"), p2),
        BetQuery("nowhere", ("x",), p1),
        BetQuery("gb-a", (scoped_id(p1, "new"), "new"), p1),  # the same question twice
    ]
    async with rig.pool.connection() as conn:
        answers = await rig.app.store.bet_contexts(conn, queries)
    assert [a.staked for a in answers] == [500, 700, 0, 0, 500]
    assert [[b["bet_id"] for b in a.stored] for a in answers] == [[], [placed[2].bet_id], [], [], []]
    assert [a.table["table_id"] if a.table else None for a in answers] == ["gb-a", "gb-b", "gb-a", None, "gb-a"]
    rounds = {t: (await rig.current(t))["round_id"] for t in ("gb-a", "gb-b")}
    assert [a.current["round_id"] if a.current else None for a in answers] == [
        rounds["gb-a"],
        rounds["gb-b"],
        rounds["gb-a"],
        None,
        rounds["gb-a"],
    ]


async def test_a_group_records_a_players_bets_only_within_the_table_maximum(rig: Rig) -> None:
    """Recording counts the player's stakes in the round, the group's own bets too: of five bets of 500 under
    a maximum of 2 000, four are recorded; the fifth is not and reports what was staked before it. Another
    player's bets and another table's are not counted."""
    rounds = {t: (await rig.current(t)) for t in ("gb-a", "gb-b")}
    now = rig.clock()
    recordings = [
        Recording(a_bet(rounds, "p1", f"m{n}", "gb-a", 500), now, "", Bounds(2_000, 2_048, 128)) for n in range(5)
    ]
    recordings += [
        Recording(a_bet(rounds, "p2", "other-player", "gb-a", 2_000), now, "", Bounds(2_000, 2_048, 128)),
        Recording(a_bet(rounds, "p1", "other-table", "gb-b", 2_000), now, "", Bounds(2_000, 2_048, 128)),
    ]
    outcomes = await rig.app.bets.groups.record_group(recordings)
    assert [o.inserted for o in outcomes] == [True] * 4 + [False] + [True, True]
    assert outcomes[4].staked == 2_000 and outcomes[4].window is not None
    staked = [b["stake_minor"] for b in await rig.app.round_bets(rounds["gb-a"]["round_id"])]
    assert sorted(staked) == [500] * 4 + [2_000]


async def test_a_bet_waiting_for_its_tables_lock_counts_the_stakes_committed_meanwhile(rig: Rig) -> None:
    """Another transaction records the player's bet and holds the table's ordering lock: a group recording the
    player's next bet waits for it, then counts it (the check's snapshot comes after the lock, not before)."""
    rounds = {t: (await rig.current(t)) for t in ("gb-a", "gb-b")}
    now = rig.clock()
    first = a_bet(rounds, "p3", "first", "gb-a", 1_500)
    second = a_bet(rounds, "p3", "second", "gb-a", 1_000)
    async with rig.pool.connection() as conn, conn.transaction():
        await rig.app.store.lock_for_recording(conn, [first["round_id"]], bet_stream("gb-a", first["bet_id"]))
        append = rig.app.bets.groups.append_placed(first)
        cursor = await rig.app.store.record_bet(conn, first, now, "", append, 2_000, 2_048, 128)
        assert (await rig.app.store.bet_recorded(cursor)).inserted
        waiting = asyncio.create_task(
            rig.app.bets.groups.record_group([Recording(second, now, "", Bounds(2_000, 2_048, 128))])
        )
        await asyncio.sleep(0.3)
        assert not waiting.done()  # the table's lock is held until this transaction commits
    (outcome,) = await asyncio.wait_for(waiting, 10)
    assert not outcome.inserted and outcome.staked == 1_500


async def test_a_players_bets_sent_at_once_stay_within_the_maximum_and_the_refused_holds_are_released(
    rig: Rig,
) -> None:
    """Through PlaceBet: eight bets of 500 from one player at once under a maximum of 2 000 a player and
    round: four are placed, the others refused ABOVE_TABLE_MAXIMUM (at the checks or at the recording),
    and only the placed bets' holds stay open."""
    await rig.create("gb-m", "golden_bull", min_bet_minor=100, max_bet_minor=2_000, chips_minor=[100, 500])
    await rig.to_phase("gb-m", Phase.BETTING)
    calls = [rig.app.place_bet(player("p4"), f"m{n}", "gb-m", f"area_{n % 3 + 1}", 500) for n in range(8)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    placed = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(placed) == 4 and all(r.status == "placed" for r in placed)
    assert all(isinstance(e, FailedPrecondition) and e.reason == "ABOVE_TABLE_MAXIMUM" for e in refused), refused
    bets = await rig.app.round_bets((await rig.current("gb-m"))["round_id"])
    assert sum(b["stake_minor"] for b in bets) == 2_000
    assert sorted(rig.open_holds()) == sorted(r.hold_id for r in placed)
