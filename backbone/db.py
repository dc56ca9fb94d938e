"""PostgreSQL access: one async pool per service, schema set-up, helpers.

Every connection a service opens has bounded waits (``DbTimeouts``, from the environment):
a connect timeout, ``statement_timeout``, ``lock_timeout`` and
``idle_in_transaction_session_timeout``, passed as libpq ``options`` so they hold from the
first statement on, pooled or not. A wait that runs out fails the statement
(``QueryCanceled`` / ``LockNotAvailable``); the gRPC layer answers it as UNAVAILABLE.

A list parameter whose statement names its array type goes in binary: ``unnest(%b::text[])``,
``%(ids)b::uuid[]``. For ``%s`` psycopg writes a list in PostgreSQL's text form element by element
in Python (ten 160-byte ``bytea`` values: 57 µs against 4 in binary). Binary elements carry their
type (``text[]`` for strings, where ``%s`` sends an untyped literal the server fits to the column),
so a list without a cast (``= ANY(%s)`` of a few ids) stays ``%s``.

Rows of a growing table looked up by a list of keys go through ``each_by_key``. A statement a
connection runs often is prepared, and PostgreSQL keeps one generic plan for it until an ANALYZE
of its tables: planned while the table was new and never analyzed (taken to be ten pages), ``key =
ANY($1)`` read the whole table on every call, and went on doing so as it grew, until autovacuum
first analyzed it, a minute or more later (a 20-second load read 10.2 million bet rows for 6 291
bets; ``tests/backbone/test_plans.py``).
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
from psycopg import pq, sql
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


def each_by_key(table: str, key: str, columns: str = "*", *, lock: bool = False) -> str:
    """``SELECT columns`` of the rows of ``table`` whose ``key`` is in the text array parameter (``%b``),
    one primary-key lookup per key whatever the table's size and statistics: the keys are joined one by
    one to a subquery the planner cannot merge into a join (``OFFSET 0``, or ``FOR UPDATE`` with
    ``lock``, which then locks the rows in the array's order)."""
    fence = "FOR UPDATE" if lock else "OFFSET 0"
    return (
        f"SELECT {columns} FROM unnest(%b::text[]) AS k (id)"
        f" CROSS JOIN LATERAL (SELECT * FROM {table} WHERE {key} = k.id {fence}) r"
    )


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


class Framed:
    """A transaction framed by explicit ``BEGIN`` and ``COMMIT`` statements (``framed``), which the
    caller sends where it likes: in a pipeline with its first and last statements, each then costs
    no round trip of its own."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    async def begin(self) -> None:
        await self._conn.execute("BEGIN")

    async def commit(self) -> None:
        await self._conn.execute("COMMIT")


@contextlib.asynccontextmanager
async def framed(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[Framed]:
    """A transaction whose ``BEGIN`` and ``COMMIT`` the block sends itself (``Framed``), so that each
    can travel with other statements in a pipeline.

    psycopg's ``conn.transaction()`` waits for the server at its BEGIN and again at its COMMIT, and
    inside ``conn.pipeline()`` four times (a Sync after the BEGIN, and around the COMMIT); a
    transaction psycopg starts by itself waits for its BEGIN too. Here the connection is in
    autocommit for the block, so psycopg starts nothing, and the server keeps the statements between
    the block's BEGIN and COMMIT in one transaction. ``conn`` (idle, outside a pipeline) must not be
    committed, rolled back or given a ``transaction()`` inside; its savepoints work as usual. A block
    that ends before its COMMIT (an exception, or a statement that failed and aborted the
    transaction) is rolled back: nothing of it is kept. The connection leaves as it came
    (autocommit off), or closed when that cannot be told (broken, or cancelled mid-exchange), so
    a pool never lends one in autocommit.
    """
    if conn.info.transaction_status != pq.TransactionStatus.IDLE or conn.info.pipeline_status:
        raise psycopg.ProgrammingError("framed() needs an idle connection outside a pipeline")
    await conn.set_autocommit(True)
    try:
        yield Framed(conn)
    finally:
        await _restore(conn)


@contextlib.asynccontextmanager
async def sent_together(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A transaction in pipeline mode whose BEGIN travels with its first statement and whose COMMIT
    with its last (``framed``): one round trip for statements whose results are read after the
    block, one more for each read inside it (a Flush). An error is raised at the block's end, as
    psycopg's pipeline does, and nothing of the block is kept."""
    async with framed(conn) as tx, conn.pipeline():
        await tx.begin()
        yield conn
        await tx.commit()


async def _restore(conn: psycopg.AsyncConnection[Any]) -> None:
    """After ``framed``: no transaction left open, autocommit off, or the connection closed."""
    restored = False
    try:
        if conn.info.transaction_status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR):
            # psycopg's own rollback, not a ROLLBACK statement: it also forgets the statements it
            # prepared (DEALLOCATE ALL). A pipeline aborted by an error leaves psycopg counting as
            # prepared a statement whose Parse the server skipped: its next use would fail with
            # "prepared statement does not exist".
            await conn.rollback()
        if conn.info.transaction_status == pq.TransactionStatus.IDLE:
            await conn.set_autocommit(False)
            restored = True
    except psycopg.Error:
        pass
    finally:
        if not restored:
            await conn.close()


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
