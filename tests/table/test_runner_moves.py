"""A table's loop sleeps until its next step is due, woken early by a move of its table on Redis.

Real PostgreSQL and Redis (only this test's keys and channels); fake rng, wallet and clock. The fake
clock stands still, so the loop's own sleep is the round's whole betting window (60 s of wall time):
only a move announced on Redis, or the loop's ``max_rest_s``, makes it step sooner.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from services.table.common import Phase
from services.table.runner import TableSupervisor
from services.table.watch import Notifier
from tests.table.table_rig import Rig, setup_schema

pytestmark = pytest.mark.integration

BETTING_SECONDS = 60


class Counted:
    """The app's real ``step``, with the moments it was called."""

    def __init__(self, rig: Rig) -> None:
        self.calls: list[float] = []
        self._step = rig.app.step
        rig.app.step = self  # type: ignore[method-assign]

    async def __call__(self, table_id: str, fencing_token: int = 0) -> float | None:
        self.calls.append(time.monotonic())
        return await self._step(table_id, fencing_token)


async def _until(check: Callable[[], Awaitable[bool]], what: str, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def _running(
    rig: Rig, redis: Redis, prefix: str, max_rest_s: float
) -> tuple[Notifier, asyncio.Event, list[asyncio.Task[None]]]:
    notifier = Notifier(redis, prefix)
    stop = asyncio.Event()
    supervisor = TableSupervisor(
        rig.app, redis, "replica-m", lease_prefix=prefix, moves=notifier.next_move, max_rest_s=max_rest_s
    )
    tasks = [asyncio.create_task(notifier.run(stop)), asyncio.create_task(supervisor.run(stop))]
    return notifier, stop, tasks


async def _betting(rig: Rig, table_id: str) -> bool:
    current = (await rig.app.get_table(table_id))[1]
    return current is not None and current["phase"] == Phase.BETTING


async def _past_betting(rig: Rig, table_id: str) -> bool:
    current = (await rig.app.get_table(table_id))[1]
    return current is not None and current["phase"] != Phase.BETTING


async def test_a_resting_loop_steps_no_more_until_its_table_moves(
    pool: AsyncConnectionPool, redis: Redis, unique: str
) -> None:
    rig = Rig(pool, await setup_schema(pool), {})
    await rig.create("mv", "golden_bull", betting_seconds=BETTING_SECONDS)
    steps = Counted(rig)
    notifier, stop, tasks = await _running(rig, redis, f"t{unique}.", max_rest_s=120)
    try:
        await _until(lambda: _betting(rig, "mv"), "the loop never opened a round", 30)
        await asyncio.sleep(0.5)  # the step after the opening, which finds betting open for 60 s
        before = len(steps.calls)
        watcher = asyncio.create_task(notifier.wait("mv", 30))
        await asyncio.sleep(0.1)  # the watcher waits
        notifier.publish("mv", stepped=True)  # a step of the runner's own: the watchers wake, not the runner
        await asyncio.sleep(2.0)
        assert watcher.done(), "the runner's step was not announced to the watchers"
        assert len(steps.calls) - before == 0, "the loop stepped while nothing was due and nothing moved"

        rig.clock.advance(BETTING_SECONDS + 1)  # betting is due to close; the loop still rests for ~60 s
        moved_at = time.monotonic()
        notifier.publish("mv")  # as any replica announces a move of the table
        await _until(lambda: _past_betting(rig, "mv"), "the move did not wake the loop", 10)
        assert steps.calls[-1] >= moved_at
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def test_with_no_move_announced_the_loop_still_steps_every_max_rest(
    pool: AsyncConnectionPool, redis: Redis, unique: str
) -> None:
    rig = Rig(pool, await setup_schema(pool), {})
    await rig.create("mr", "golden_bull", betting_seconds=BETTING_SECONDS)
    _, stop, tasks = await _running(rig, redis, f"t{unique}.", max_rest_s=1.0)
    try:
        await _until(lambda: _betting(rig, "mr"), "the loop never opened a round", 30)
        rig.clock.advance(BETTING_SECONDS + 1)  # a move Redis never announced (lost, or Redis down)
        await _until(lambda: _past_betting(rig, "mr"), "the loop never stepped without an announcement", 10)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
