"""The wallet application's shared ground: transactions, account locks and appends, the clock.

Each command runs in its own transaction (retried a bounded number of times when a
concurrent writer wins a race); the application's parts (app_users, app_holds,
app_settlement and app itself) build on ``AppBase``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from backbone.db import sent_together
from backbone.errors import Aborted, NotFound
from backbone.eventstore import ConcurrencyError, EventStore, NewEvent
from services.wallet import events, repo, repo_play
from services.wallet.domain_play import ResponsiblePlay

log = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], datetime]

MAX_ATTEMPTS = 8
"""Bound on retries of one command after losing a race (unique key, deadlock, serialization)."""
RETRY_BACKOFF_S = 0.005

_RETRYABLE = (
    psycopg.errors.UniqueViolation,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
    ConcurrencyError,
)


class AppBase:
    """What every part of the wallet application shares: its pool and event store, the clock, the
    transactions a command runs in (retried after losing a race), the account locks and appends.
    ``WalletApp`` (app.py) sets the attributes."""

    _pool: AsyncConnectionPool
    _store: EventStore
    clock: Clock

    async def _transaction(self, work: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                async with self._pool.connection() as conn, conn.transaction():
                    return await work(conn)
            except _RETRYABLE as error:
                if attempt == MAX_ATTEMPTS:
                    log.warning("gave up after concurrent updates", extra={"error": str(error)})
                    raise Aborted("CONCURRENT_UPDATE", "too many concurrent updates; retry with the same id") from None
                await asyncio.sleep(RETRY_BACKOFF_S * attempt)
        raise AssertionError("unreachable")

    async def _pipelined(self, work: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        """``_transaction`` in pipeline mode (``sent_together``): the BEGIN travels with the first
        statements, statements whose results ``work`` does not read travel together, and the writes
        after its last read go with the COMMIT (errors surface there and are retried like the others)."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                async with self._pool.connection() as conn:
                    async with sent_together(conn):
                        result = await work(conn)
                    return result
            except _RETRYABLE as error:
                if attempt == MAX_ATTEMPTS:
                    log.warning("gave up after concurrent updates", extra={"error": str(error)})
                    raise Aborted("CONCURRENT_UPDATE", "too many concurrent updates; retry with the same id") from None
                await asyncio.sleep(RETRY_BACKOFF_S * attempt)
        raise AssertionError("unreachable")

    async def _append_account(
        self, conn: psycopg.AsyncConnection, locked: repo.LockedAccount, new_events: list[NewEvent]
    ) -> None:
        name = locked.state.account
        await self._store.append(conn, events.account_stream(name), locked.version, new_events)
        await repo.bump_version(conn, name, locked.version + len(new_events))

    @staticmethod
    async def _lock(conn: psycopg.AsyncConnection, names: list[str]) -> dict[str, repo.LockedAccount]:
        locked = await repo.lock_accounts(conn, names)
        for name in names:
            if name not in locked:
                raise NotFound("ACCOUNT_NOT_FOUND", f"no account {name}")
        return locked

    async def _play(self, conn: psycopg.AsyncConnection, account: str, now: datetime) -> ResponsiblePlay:
        return ResponsiblePlay(
            await repo_play.limits(conn, account),
            await repo_play.exclusion(conn, account),
            await repo_play.window_sums(conn, account, now),
        )
