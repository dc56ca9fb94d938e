"""Runs every table's rounds, one owner per table across replicas.

Each replica's supervisor tries to take a Redis lease per table; the holder runs
that table's round loop, renewing the lease as it goes. A replica that dies stops
renewing, the lease expires, and another replica takes the table over and
resumes from the stored round (every step re-reads its state, so nothing is done
twice). The lease's fencing token is stamped on every round the owner opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.asyncio import Redis

from backbone.errors import DomainError
from backbone.lease import RedisLease
from services.table.app import TableApp

log = logging.getLogger(__name__)

LEASE_TTL_MS = 5_000
SUPERVISE_EVERY_S = 1.0
MAX_STEP_SLEEP_S = 0.5
ERROR_BACKOFF_S = 1.0


class TableSupervisor:
    def __init__(self, app: TableApp, redis: Redis, owner: str, *, lease_prefix: str = "") -> None:
        self._app = app
        self._redis = redis
        self._owner = owner
        self._lease_prefix = lease_prefix
        self._loops: dict[str, asyncio.Task[None]] = {}

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

    async def _supervise(self, stop: asyncio.Event) -> None:
        for table_id in await self._app.list_tables():
            task = self._loops.get(table_id)
            if task is not None and not task.done():
                continue
            lease = RedisLease(self._redis, f"table:{self._lease_prefix}{table_id}", self._owner, LEASE_TTL_MS)
            token = await lease.acquire()
            if token is not None:
                log.info("took table", extra={"table_id": table_id, "fencing_token": token})
                self._loops[table_id] = asyncio.create_task(self._table_loop(table_id, lease, token, stop))

    async def _table_loop(self, table_id: str, lease: RedisLease, token: int, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                if not await lease.renew():
                    log.warning("lost table lease", extra={"table_id": table_id})
                    return
                try:
                    delay = await self._app.step(table_id, token)
                except DomainError as error:
                    log.warning("round step refused", extra={"table_id": table_id, "error": str(error)})
                    delay = ERROR_BACKOFF_S
                except Exception:
                    log.exception("round step failed", extra={"table_id": table_id})
                    delay = ERROR_BACKOFF_S
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), min(delay, MAX_STEP_SLEEP_S))
        finally:
            await lease.release()
