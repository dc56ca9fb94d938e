"""Runs every table's rounds, one owner per table across replicas, the tables shared among them.

Each replica's supervisor announces itself among the table replicas and takes the Redis
lease of each open table that the assignment gives it (``placement``: rendezvous hashing
over the live replicas, at most one table more than any other replica); the holder runs
that table's round loop while a keeper renews the lease in the background. A replica that
dies stops renewing its membership and its leases, both expire, and the replicas the
tables now fall to take them over and resume from the stored round (every step re-reads
its state, so nothing is done twice). A replica whose table now falls to another (one
joined, or the tables changed) finishes the step in progress, releases the lease, and the
other takes the table on its next round of supervision; so a table moves within one lease
time to live of a replica joining or leaving. Bets do not depend on who runs the table:
any replica records them in PostgreSQL under the round's locks.

The lease's fencing token comes from the table service's own database
(``backbone.lease.PgFence``), so it grows with every new owner whatever Redis
loses; it is stamped on every round the owner opens and checked in every step's
transaction (``RoundMachine.append``): a stale owner (paused past its lease, or
running on while Redis forgot it) has its writes refused and stops.

Every step is bounded (the calls it makes have deadlines, ``ports.CALL_TIMEOUT_S``,
and retry once per step), and a step still running when the lease is lost is
cancelled.

Between steps a table's loop sleeps until its next step is due, or until the table moves: every
change of a table, on any replica, is announced on Redis (``watch.Notifier``), and a move wakes
the loop at most ``MOVE_STEP_S`` after its last step (a bet, a bid, a seat taken, a closing asked
for are all seen within that, as the watchers see them). Redis only hurries the loop: with no
announcement a loop still steps every ``MAX_REST_S``, so a move Redis lost waits that long at
most; without a notifier (``moves`` None) it steps every ``MOVE_STEP_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from redis.asyncio import Redis

from backbone.errors import DomainError
from backbone.lease import PgFence, RedisLease, StaleOwner, fenced
from services.table import metrics
from services.table.app import TableApp
from services.table.placement import Membership, assign

log = logging.getLogger(__name__)

LEASE_TTL_MS = 5_000
RENEW_EVERY_S = 1.5
"""The keeper renews the lease this often: three tries inside its time to live."""
SUPERVISE_EVERY_S = 1.0
MOVE_STEP_S = 0.5
"""A table's loop steps at most this long after a move of its table (or, with no notifier, this often)."""
MAX_REST_S = 2.0
"""With a notifier, a table's loop steps at least this often, announced moves or not."""
ERROR_BACKOFF_S = 0.5
"""After a failed step (e.g. the rng unreachable): short, so a round opens as soon as the rng answers again."""


def lease_name(prefix: str, table_id: str) -> str:
    return f"table:{prefix}{table_id}"


def member_group(prefix: str) -> str:
    """The membership group of the table replicas of one system (its topic prefix)."""
    return f"table:{prefix}"


Moves = Callable[[str], asyncio.Event]
"""``moves(table_id)``: an event set at the table's next move announced after the call."""


class TableSupervisor:
    def __init__(
        self,
        app: TableApp,
        redis: Redis,
        owner: str,
        *,
        lease_prefix: str = "",
        moves: Moves | None = None,
        max_rest_s: float = MAX_REST_S,
    ) -> None:
        self._app = app
        self._moves = moves
        self._max_rest_s = max_rest_s
        self._redis = redis
        self._owner = owner
        self._lease_prefix = lease_prefix
        self._membership = Membership(redis, member_group(lease_prefix), owner, LEASE_TTL_MS)
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._handovers: dict[str, asyncio.Event] = {}

    def running(self) -> frozenset[str]:
        """The tables whose rounds this replica runs now."""
        return frozenset(table_id for table_id, task in self._loops.items() if not task.done())

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    await self._supervise(stop)
                except Exception:
                    log.exception("table supervisor failed; retrying")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), SUPERVISE_EVERY_S)
        finally:
            for task in self._loops.values():
                task.cancel()
            for task in self._loops.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            with contextlib.suppress(Exception):  # else the others wait for the key to expire
                await self._membership.leave()

    async def _supervise(self, stop: asyncio.Event) -> None:
        members = await self._membership.beat()
        owners = assign(await self._app.list_tables(open_only=True), members)
        self._loops = {table_id: task for table_id, task in self._loops.items() if not task.done()}
        self._handovers = {table_id: self._handovers[table_id] for table_id in self._loops}
        for table_id in self._loops:
            if owners.get(table_id) != self._owner and not self._handovers[table_id].is_set():
                log.info("handing table over", extra={"table_id": table_id, "to": owners.get(table_id)})
                self._handovers[table_id].set()  # the loop stops after its step in progress and releases
        for table_id, owner in owners.items():
            if owner != self._owner or table_id in self._loops:
                continue
            name = lease_name(self._lease_prefix, table_id)
            lease = RedisLease(self._redis, name, self._owner, LEASE_TTL_MS, fence=PgFence(self._app.pool, name))
            token = await lease.acquire()
            if token is not None:
                log.info("took table", extra={"table_id": table_id, "fencing_token": token})
                metrics.table_started(table_id, self._app.ctx.now())
                handover = self._handovers[table_id] = asyncio.Event()
                self._loops[table_id] = asyncio.create_task(self._table_loop(table_id, lease, token, stop, handover))

    async def _table_loop(
        self, table_id: str, lease: RedisLease, token: int, stop: asyncio.Event, handover: asyncio.Event
    ) -> None:
        """Step the table's rounds while the lease is ours, until stopped or the table is another's."""
        assert lease.fence is not None
        lost = asyncio.Event()
        keeper = asyncio.create_task(_keep(lease, lost, stop))
        try:
            with fenced(lease.fence, token):
                while not (stop.is_set() or lost.is_set() or handover.is_set()):
                    moved = self._moves(table_id) if self._moves is not None else None  # before the step reads
                    try:
                        delay = await _unless(lost, self._app.step(table_id, token))
                    except StaleOwner as error:
                        log.warning("table taken over; stopping", extra={"table_id": table_id, "error": str(error)})
                        return
                    except DomainError as error:
                        log.warning("round step refused", extra={"table_id": table_id, "error": str(error)})
                        delay = ERROR_BACKOFF_S
                    except Exception:
                        log.exception("round step failed", extra={"table_id": table_id})
                        delay = ERROR_BACKOFF_S
                    if delay is None:  # the table is closed: nothing more to run
                        log.info("table closed; releasing it", extra={"table_id": table_id})
                        metrics.table_closed(table_id)
                        return
                    if delay > 0:
                        await self._rest(delay, moved, stop, handover)
            if lost.is_set():
                log.warning("lost table lease", extra={"table_id": table_id})
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await keeper
            with contextlib.suppress(Exception):
                await lease.release()

    async def _rest(
        self, delay: float, moved: asyncio.Event | None, stop: asyncio.Event, handover: asyncio.Event
    ) -> None:
        """Until the next step: ``delay`` seconds (when it is due), or ``MOVE_STEP_S`` after the last step
        once the table moved (``moved``), and at most ``max_rest_s`` (``MOVE_STEP_S`` without a notifier)."""
        if moved is None:
            await _first(stop, handover, timeout_s=min(delay, MOVE_STEP_S))
            return
        loop = asyncio.get_running_loop()
        rested_at = loop.time()
        await _first(stop, handover, moved, timeout_s=min(delay, self._max_rest_s))
        left = min(delay, MOVE_STEP_S) - (loop.time() - rested_at)
        if moved.is_set() and left > 0:
            await _first(stop, handover, timeout_s=left)


async def _first(*events: asyncio.Event, timeout_s: float) -> None:
    """Wait until one of ``events`` is set, or ``timeout_s`` passed."""
    waiters = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def _keep(lease: RedisLease, lost: asyncio.Event, stop: asyncio.Event) -> None:
    """Renew ``lease`` until stopped; set ``lost`` when it could not be renewed."""
    while not stop.is_set():
        try:
            renewed = await asyncio.wait_for(lease.renew(), RENEW_EVERY_S)
        except Exception:
            log.warning("lease renewal failed", extra={"lease": lease.name}, exc_info=True)
            renewed = False
        if not renewed:
            lost.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), RENEW_EVERY_S)


async def _unless(lost: asyncio.Event, work: Coroutine[Any, Any, float | None]) -> float | None:
    """Run the step ``work``; cancel it when the lease is lost (its transaction rolls back)."""
    step = asyncio.create_task(work)
    watcher = asyncio.create_task(lost.wait())
    try:
        await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not step.done():
        step.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await step
        return 0.0
    return step.result()
