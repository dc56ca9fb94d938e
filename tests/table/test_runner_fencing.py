"""The table's owner is fenced: a superseded owner's round step is refused, whatever Redis lost.

Real PostgreSQL and Redis (only this test's keys are touched); fake rng, wallet and clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from backbone.db import open_pool
from backbone.lease import PgFence, RedisLease, StaleOwner, fenced
from services.table.common import Phase
from services.table.placement import assign
from services.table.runner import LEASE_TTL_MS, TableSupervisor, lease_name
from tests.table.table_rig import Rig, player, setup_schema

pytestmark = pytest.mark.integration

BALANCES = {"player:p1": 100_000}


@pytest.fixture
async def pool(dsn: str, schema: str) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_pool(dsn, schema=schema, max_size=8)
    yield pool
    await pool.close()


async def test_a_superseded_owner_cannot_step_the_round(pool: AsyncConnectionPool, redis: Redis, unique: str) -> None:
    rig = Rig(pool, await setup_schema(pool), BALANCES)
    await rig.create("ft", "golden_bull")
    name = lease_name(f"t{unique}.", "ft")
    old = RedisLease(redis, name, "old", LEASE_TTL_MS, fence=PgFence(pool, name))
    old_token = await old.acquire()
    assert old_token is not None
    with fenced(PgFence(pool, name), old_token):
        await rig.app.step("ft", old_token)
    opened = await rig.current("ft")
    assert opened["phase"] == Phase.BETTING and opened["fencing_token"] == old_token

    await redis.delete(old.key)  # Redis lost the lease (restart without persistence, FLUSHALL)
    new = RedisLease(redis, name, "new", LEASE_TTL_MS, fence=PgFence(pool, name))
    new_token = await new.acquire()
    assert new_token is not None and new_token > old_token
    rig.clock.advance(60)  # betting is due to close

    with fenced(PgFence(pool, name), old_token), pytest.raises(StaleOwner):
        await rig.app.step("ft", old_token)  # the old owner, still running: refused, nothing written
    assert (await rig.current("ft"))["phase"] == Phase.BETTING

    with fenced(PgFence(pool, name), new_token):
        await rig.app.step("ft", new_token)
    assert (await rig.current("ft"))["phase"] == Phase.DEALING
    await new.release()


async def test_a_supervisor_stops_running_a_table_it_lost_and_another_takes_it_over(
    pool: AsyncConnectionPool, redis: Redis, unique: str
) -> None:
    rig = Rig(pool, await setup_schema(pool), BALANCES)
    await rig.create("fs", "golden_bull")
    prefix = f"t{unique}."
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    a = TableSupervisor(rig.app, redis, "replica-a", lease_prefix=prefix)
    runner_a = asyncio.create_task(a.run(stop_a))
    try:
        deadline = time.monotonic() + 30
        while (await rig.app.get_table("fs"))[1] is None:
            assert time.monotonic() < deadline, "replica a never opened a round"
            await asyncio.sleep(0.1)
        name = lease_name(prefix, "fs")
        probe = RedisLease(redis, name, "probe", LEASE_TTL_MS)
        held = await probe.holder()
        assert held is not None and held[0] == "replica-a"
        token_a = held[1]

        await redis.delete(f"niuniu:lease:{name}")  # Redis forgets a's lease; b takes the table
        b_name = next(n for n in (f"replica-b{i}" for i in range(100)) if assign(["fs"], ["replica-a", n])["fs"] == n)
        b = TableSupervisor(rig.app, redis, b_name, lease_prefix=prefix)
        runner_b = asyncio.create_task(b.run(stop_b))
        deadline = time.monotonic() + 30
        while True:
            held = await probe.holder()
            if held is not None and held[0] == b_name and held[1] > 0:
                break
            assert time.monotonic() < deadline, "replica b never took the table"
            await asyncio.sleep(0.1)
        token_b = held[1]
        assert token_b > token_a
        deadline = time.monotonic() + 10
        while "fs" in a.running():  # a's keeper found the lease gone: a stops running the table
            assert time.monotonic() < deadline, "replica a went on running a table it lost"
            await asyncio.sleep(0.1)
        assert await PgFence(pool, name).current() == token_b
        stop_b.set()
        await runner_b
    finally:
        stop_a.set()
        stop_b.set()
        await runner_a


async def test_a_superseded_owner_seats_no_banker_and_holds_nothing(
    pool: AsyncConnectionPool, redis: Redis, unique: str
) -> None:
    """Opening a banked round starts with the banker's seat and hold, before the round's own fenced
    write: a superseded owner is refused there, before it changes the seat or asks the wallet."""
    rig = Rig(pool, await setup_schema(pool), {"player:p5": 1_000_000})
    await rig.create("fb", "baibian_bull", {"banker.min_capital_minor": "100000"})
    await rig.app.banker.apply(player("p5"), "fb", 1_000_000)
    name = lease_name(f"t{unique}.", "fb")
    old = RedisLease(redis, name, "old", LEASE_TTL_MS, fence=PgFence(pool, name))
    old_token = await old.acquire()
    await redis.delete(old.key)  # Redis lost the lease; another replica takes the table
    new = RedisLease(redis, name, "new", LEASE_TTL_MS, fence=PgFence(pool, name))
    new_token = await new.acquire()
    assert old_token is not None and new_token is not None and new_token > old_token

    with fenced(PgFence(pool, name), old_token), pytest.raises(StaleOwner):
        await rig.app.step("fb", old_token)
    assert (await rig.app.get_table("fb"))[1] is None  # no round
    queue = await rig.app.banker.queue("fb")
    assert queue.banker == "" and [e.player for e in queue.queue] == ["player:p5"]  # not seated: still in line
    assert rig.open_holds() == []  # the wallet was not asked

    with fenced(PgFence(pool, name), new_token):
        await rig.app.step("fb", new_token)
    opened = await rig.current("fb")
    assert rig.open_holds() == [f"banker.{opened['round_id']}.p5"]
    await new.release()
