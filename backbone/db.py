"""PostgreSQL access: one async pool per service, schema set-up, helpers.

Every connection a service opens has bounded waits (``DbTimeouts``, from the environment):
a connect timeout, ``statement_timeout``, ``lock_timeout`` and
``idle_in_transaction_session_timeout``, passed as libpq ``options`` so they hold from the
first statement on, pooled or not. A wait that runs out fails the statement
(``QueryCanceled`` / ``LockNotAvailable``); the gRPC layer answers it as UNAVAILABLE.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from backbone.config import DbTimeouts

DDL_LOCK_TIMEOUT_MS = 60_000
"""Schema set-up waits longer than a request: replicas starting together queue on one lock."""
RECENTLY_RETURNED_S = 1.0
"""A pooled connection handed back in a clean state less than this ago is handed out again without
a check: it answered its last statement a moment ago. Checking every checkout cost a round trip
and ~5-14 % of a busy service's time; the connections an outage broke sit idle longer than this
(or fail their next statement, which the pool then replaces)."""

_returned_at: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float] = weakref.WeakKeyDictionary()


async def _note_return(conn: psycopg.AsyncConnection[Any]) -> None:
    """The pool's ``reset`` hook: runs for every connection coming back idle (broken ones are discarded)."""
    _returned_at[conn] = time.monotonic()


async def check_idle_connection(conn: psycopg.AsyncConnection[Any]) -> None:
    """The pool's ``check``: a round trip, unless ``conn`` came back moments ago in a clean state."""
    returned = _returned_at.pop(conn, None)  # popped: a connection is vouched for by one return only
    if returned is not None and time.monotonic() - returned < RECENTLY_RETURNED_S and not conn.closed:
        return
    await AsyncConnectionPool.check_connection(conn)


def connect_kwargs(dsn: str, timeouts: DbTimeouts | None = None) -> dict[str, Any]:
    """libpq parameters that bound every wait of a connection to ``dsn`` (merged into its own ``options``)."""
    timeouts = timeouts or DbTimeouts.from_env()
    settings = (
        f"-c statement_timeout={timeouts.statement_timeout_ms}"
        f" -c lock_timeout={timeouts.lock_timeout_ms}"
        f" -c idle_in_transaction_session_timeout={timeouts.idle_in_transaction_timeout_ms}"
    )
    existing = str(conninfo_to_dict(dsn).get("options") or "")
    return {
        "connect_timeout": timeouts.connect_timeout_s,
        "options": f"{existing} {settings}".strip(),
    }


async def connect(dsn: str, *, autocommit: bool = False, timeouts: DbTimeouts | None = None) -> psycopg.AsyncConnection:
    """One connection outside the pool, with the same bounded waits."""
    return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, **connect_kwargs(dsn, timeouts))


async def open_pool(
    dsn: str,
    *,
    min_size: int = 2,
    max_size: int = 20,
    schema: str | None = None,
    timeouts: DbTimeouts | None = None,
) -> AsyncConnectionPool:
    """Open a pool whose connections use ``schema`` first on their search path (when given).

    A caller waits at most ``timeouts.pool_timeout_s`` for a connection (``PoolTimeout``), and
    each connection idle for a while is checked before it is handed out
    (``check_idle_connection``), so the connections a database outage broke are replaced
    instead of failing the first requests after it returns.
    """
    timeouts = timeouts or DbTimeouts.from_env()

    async def configure(conn: psycopg.AsyncConnection) -> None:
        if schema is not None:
            await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
            await conn.commit()

    pool = AsyncConnectionPool(
        dsn,
        kwargs=connect_kwargs(dsn, timeouts),
        min_size=min_size,
        max_size=max_size,
        open=False,
        configure=configure,
        check=check_idle_connection,
        reset=_note_return,
        timeout=timeouts.pool_timeout_s,
    )
    await pool.open(wait=True, timeout=timeouts.startup_timeout_s)
    return pool


async def run_ddl(conn: psycopg.AsyncConnection, statements: Sequence[str]) -> None:
    """Apply idempotent DDL (``CREATE ... IF NOT EXISTS``) in one transaction.

    An advisory lock makes concurrent starts of several replicas safe: two
    ``CREATE TABLE IF NOT EXISTS`` racing can otherwise fail on the catalog.
    """
    async with conn.transaction():
        await _longer_waits(conn)
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('niuniu.ddl'))")
        for statement in statements:
            await conn.execute(statement)


async def create_schema(conn: psycopg.AsyncConnection, schema: str, *, fresh: bool = False) -> None:
    async with conn.transaction():
        await _longer_waits(conn)
        if fresh:
            await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))


async def _longer_waits(conn: psycopg.AsyncConnection) -> None:
    """Raise this transaction's lock and statement bounds to ``DDL_LOCK_TIMEOUT_MS`` (still bounded)."""
    await conn.execute(f"SET LOCAL lock_timeout = {DDL_LOCK_TIMEOUT_MS}")
    await conn.execute(f"SET LOCAL statement_timeout = {DDL_LOCK_TIMEOUT_MS}")
