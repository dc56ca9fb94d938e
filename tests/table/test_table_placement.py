"""The tables are shared among the live table replicas, and move when one joins or leaves.

The assignment's properties are pure (Hypothesis); the rest runs the real supervisors on the
real PostgreSQL and Redis (only this test's keys), with the rig's fake rng, wallet and clock,
one replica in a process of its own so that it can be killed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from backbone.lease import PgFence
from services.table.placement import Membership, assign
from services.table.runner import LEASE_TTL_MS, SUPERVISE_EVERY_S, TableSupervisor, lease_name, member_group
from tests.table.table_rig import Rig, player, setup_schema

ROOT = Path(__file__).resolve().parents[2]
TABLES = [f"pt{i}" for i in range(12)]
TTL_S = LEASE_TTL_MS / 1000
SETTLE_S = 2.5
"""A move without a death: the next round of supervision of both replicas (one second apart each)."""
TAKEOVER_S = TTL_S + SUPERVISE_EVERY_S + 1.0
"""A replica's death: its membership and leases expire within the lease's time to live of its last
renewal, the next round of supervision takes its tables (and a second of slack for a busy machine)."""

names = st.text(st.characters(codec="utf-8", exclude_characters="|"), min_size=1, max_size=12)


@given(st.sets(names, max_size=60), st.sets(names, min_size=1, max_size=8))
def test_every_table_has_one_owner_and_loads_differ_by_at_most_one(tables: set[str], members: set[str]) -> None:
    owners = assign(tables, members)
    assert set(owners) == tables and set(owners.values()) <= members
    load = Counter(owners.values())
    counts = [load[member] for member in members]
    assert max(counts) - min(counts) <= 1


@given(st.lists(names, max_size=30), st.lists(names, min_size=1, max_size=6))
def test_every_replica_computes_the_same_owners(tables: list[str], members: list[str]) -> None:
    shuffled_tables, shuffled_members = tables[::-1] + tables, members[::-1]
    assert assign(tables, members) == assign(shuffled_tables, shuffled_members)


def test_no_member_no_owner() -> None:
    assert assign(TABLES, []) == {}


# ------------------------------------------------------------------------------ on the real Redis and PostgreSQL


@pytest.mark.integration
async def test_membership_is_the_live_keys_and_comes_back_when_redis_forgets_it(redis: Redis, unique: str) -> None:
    a = Membership(redis, f"g{unique}", "a", 300)
    b = Membership(redis, f"g{unique}", "b", 5_000)
    assert await a.beat() == ["a"]
    assert await b.beat() == ["a", "b"]
    await asyncio.sleep(0.4)  # a stopped beating: its key expired
    assert await b.beat() == ["b"]
    await redis.delete(b.index_key, b.member_prefix + "b")  # Redis lost everything
    assert await a.beat() == ["a"]
    assert await b.beat() == ["a", "b"]
    await b.leave()
    assert await a.beat() == ["a"]
    await a.leave()


async def holders(redis: Redis, prefix: str) -> dict[str, str]:
    """Each of the tables' lease holder (only confirmed holders: a reservation has token 0)."""
    keys = [f"niuniu:lease:{lease_name(prefix, table_id)}" for table_id in TABLES]
    values = await redis.mget(keys)
    held = {}
    for table_id, raw in zip(TABLES, values, strict=True):
        if raw is not None:
            owner, _, token = (raw.decode() if isinstance(raw, bytes) else raw).rpartition("|")
            if int(token) > 0:
                held[table_id] = owner
    return held


async def until(what: str, check: Callable[[], Awaitable[bool]], within_s: float) -> float:
    """Poll ``check`` until it holds; the seconds it took (fails past ``within_s``)."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < within_s, f"{what}: not within {within_s} s"
        await asyncio.sleep(0.1)
    return time.monotonic() - started


class Replicas:
    """In-process table supervisors by name, and a check that no two of them ever run one table."""

    def __init__(self, rig: Rig, redis: Redis, prefix: str) -> None:
        self._rig, self._redis, self.prefix = rig, redis, prefix
        self.supervisors: dict[str, TableSupervisor] = {}
        self._runs: dict[str, tuple[asyncio.Event, asyncio.Task[None]]] = {}
        self.overlaps: list[str] = []

    def start(self, name: str) -> None:
        supervisor = TableSupervisor(self._rig.app, self._redis, name, lease_prefix=self.prefix)
        stop = asyncio.Event()
        self.supervisors[name] = supervisor
        self._runs[name] = (stop, asyncio.create_task(supervisor.run(stop)))

    async def stop(self, name: str) -> None:
        stop, task = self._runs.pop(name)
        stop.set()
        await task
        del self.supervisors[name]

    async def watch(self, done: asyncio.Event) -> None:
        """Sample who runs what until ``done``: a table run by two replicas at once is recorded."""
        while not done.is_set():
            seen = Counter(t for s in self.supervisors.values() for t in s.running())
            self.overlaps += [t for t, n in seen.items() if n > 1]
            await asyncio.sleep(0.02)

    async def stop_all(self) -> None:
        for name in list(self._runs):
            await self.stop(name)


@asynccontextmanager
async def replicas(rig: Rig, redis: Redis, prefix: str) -> AsyncIterator[Replicas]:
    group = Replicas(rig, redis, prefix)
    done = asyncio.Event()
    watcher = asyncio.create_task(group.watch(done))
    try:
        yield group
    finally:
        await group.stop_all()
        done.set()
        await watcher
    assert group.overlaps == [], f"tables run by two replicas at once: {sorted(set(group.overlaps))}"


@contextmanager
def replica_process(schema: str, prefix: str, name: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.table.placement_replica", schema, prefix, name],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        yield process
    finally:
        process.kill()
        process.wait()


def shares(held: dict[str, str]) -> dict[str, int]:
    return dict(Counter(held.values()))


async def open_tables(rig: Rig) -> None:
    for table_id in TABLES:
        await rig.create(table_id, "golden_bull")


@pytest.mark.integration
async def test_three_replicas_share_the_tables_and_take_over_from_one_that_dies(
    pool: AsyncConnectionPool, redis: Redis, schema: str, unique: str
) -> None:
    rig = Rig(pool, await setup_schema(pool), {})
    await open_tables(rig)
    prefix = f"t{unique}."
    async with replicas(rig, redis, prefix) as group:
        with replica_process(schema, prefix, "replica-c"):
            group.start("replica-a")
            group.start("replica-b")

            async def three_ways() -> bool:
                return shares(await holders(redis, prefix)) == {"replica-a": 4, "replica-b": 4, "replica-c": 4}

            await until("three replicas with four tables each", three_ways, 30)
            tokens = {t: await PgFence(pool, lease_name(prefix, t)).current() for t in TABLES}
        # replica-c was killed: its membership and its leases expire, a and b take its tables

        async def two_ways() -> bool:
            return shares(await holders(redis, prefix)) == {"replica-a": 6, "replica-b": 6}

        took_s = await until("the dead replica's tables taken over", two_ways, TAKEOVER_S)
        print(f"tables of the killed replica taken over in {took_s:.1f} s (lease TTL {TTL_S} s)")
        moved = [t for t in TABLES if await PgFence(pool, lease_name(prefix, t)).current() > tokens[t]]
        assert len(moved) >= 4  # each new owner took a newer fencing token

        group.start("replica-d")  # a replica (re)joins: it gets its share again

        async def back() -> bool:
            return shares(await holders(redis, prefix)) == {"replica-a": 4, "replica-b": 4, "replica-d": 4}

        await until("the joining replica's share", back, TTL_S)
        assert {t for s in group.supervisors.values() for t in s.running()} == set(TABLES)


@pytest.mark.integration
async def test_a_replica_that_stops_hands_its_tables_over_at_once(
    pool: AsyncConnectionPool, redis: Redis, unique: str
) -> None:
    rig = Rig(pool, await setup_schema(pool), {})
    await open_tables(rig)
    prefix = f"t{unique}."
    async with replicas(rig, redis, prefix) as group:
        for name in ("replica-a", "replica-b", "replica-c"):
            group.start(name)

        async def balanced() -> bool:
            return sorted(shares(await holders(redis, prefix)).values()) == [4, 4, 4]

        await until("three replicas with four tables each", balanced, 30)
        await group.stop("replica-b")  # a rolling update: it leaves and releases its leases

        async def two_ways() -> bool:
            return shares(await holders(redis, prefix)) == {"replica-a": 6, "replica-c": 6}

        await until("the stopped replica's tables taken over", two_ways, SETTLE_S)
        members = await Membership(redis, member_group(prefix), "probe", LEASE_TTL_MS).beat()
        assert members == ["probe", "replica-a", "replica-c"]


@pytest.mark.integration
async def test_a_replica_that_does_not_run_the_table_takes_its_bets(
    pool: AsyncConnectionPool, redis: Redis, unique: str
) -> None:
    rig = Rig(pool, await setup_schema(pool), {"player:p1": 100_000})
    await rig.create("pb", "golden_bull")
    prefix = f"t{unique}."
    async with replicas(rig, redis, prefix) as group:
        group.start("runner")

        async def betting() -> bool:
            return (await rig.app.get_table("pb"))[1] is not None

        await until("a round open for bets", betting, 30)
        other = rig.build()  # another replica's app: same database, runs no table
        receipt = await other.place_bet(player("p1"), "bet-1", "pb", "area_1", 500)
        assert [b["bet_id"] for b in await rig.app.round_bets(receipt.round_id)] == [receipt.bet_id]
