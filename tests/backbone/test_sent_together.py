"""``framed`` and ``sent_together``: transactions whose BEGIN and COMMIT travel with other statements, against
the real database."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import pq
from psycopg_pool import AsyncConnectionPool

from backbone.db import framed, open_pool, sent_together

pytestmark = pytest.mark.integration


class Refused(Exception):
    """A check in the block that fails after statements were queued."""


@pytest.fixture
async def pool(dsn: str, schema: str) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_pool(dsn, schema=schema, min_size=1, max_size=2)
    async with pool.connection() as conn:
        await conn.execute("CREATE TABLE items (id INT PRIMARY KEY)")
        await conn.commit()
    yield pool
    await pool.close()


@contextlib.contextmanager
def traced(conn: psycopg.AsyncConnection, path: Path) -> Iterator[list[str]]:
    """The protocol messages ``conn`` sends inside the block (libpq's trace), as their names."""
    sent: list[str] = []
    with path.open("w") as out:
        conn.pgconn.trace(out.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield sent
        finally:
            conn.pgconn.untrace()
    sent.extend(line.split("\t")[2].strip() for line in path.read_text().splitlines() if line.startswith("F\t"))


async def ids(pool: AsyncConnectionPool) -> list[int]:
    async with pool.connection() as conn:
        return [row[0] for row in await (await conn.execute("SELECT id FROM items ORDER BY id")).fetchall()]


def usable(conn: psycopg.AsyncConnection) -> bool:
    """Back as the pool lent it: idle, outside a pipeline, not in autocommit."""
    return (
        conn.info.transaction_status == pq.TransactionStatus.IDLE
        and not conn.info.pipeline_status
        and not conn.autocommit
    )


async def test_writes_commit_with_one_sync(pool: AsyncConnectionPool, tmp_path: Path) -> None:
    async with pool.connection() as conn:
        with traced(conn, tmp_path / "trace") as sent:
            async with sent_together(conn):
                await conn.execute("INSERT INTO items VALUES (1)")
                await conn.execute("INSERT INTO items VALUES (2)")
        assert usable(conn)
    # BEGIN, the two inserts and COMMIT travel before the one Sync; nothing waits on the way (psycopg
    # follows the Sync with a Flush, in the same write).
    before_sync = sent[: sent.index("Sync")]
    assert sent.count("Sync") == 1 and "Flush" not in before_sync
    assert before_sync.count("Execute") == 4
    assert await ids(pool) == [1, 2]


async def test_a_read_inside_costs_one_flush(pool: AsyncConnectionPool, tmp_path: Path) -> None:
    async with pool.connection() as conn:
        with traced(conn, tmp_path / "trace") as sent:
            async with sent_together(conn):
                cur = await conn.execute("SELECT count(*) FROM items")
                assert await cur.fetchone() == (0,)
                await conn.execute("INSERT INTO items VALUES (3)")
        assert usable(conn)
    assert sent.count("Sync") == 1 and sent[: sent.index("Sync")].count("Flush") == 1
    assert await ids(pool) == [3]


async def test_an_exception_in_the_block_keeps_nothing(pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:
        with pytest.raises(Refused):
            async with sent_together(conn):
                await conn.execute("INSERT INTO items VALUES (4)")
                raise Refused
        assert usable(conn)
        # The same connection goes on as usual.
        await conn.execute("INSERT INTO items VALUES (5)")
        await conn.commit()
    assert await ids(pool) == [5]


async def test_a_failed_statement_keeps_nothing(pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:
        with pytest.raises(psycopg.errors.UniqueViolation):
            async with sent_together(conn):
                await conn.execute("INSERT INTO items VALUES (6)")
                await conn.execute("INSERT INTO items VALUES (6)")
                await conn.execute("INSERT INTO items VALUES (7)")
        assert usable(conn)
    assert await ids(pool) == []


async def test_a_failed_read_inside_keeps_nothing(pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            async with sent_together(conn):
                await conn.execute("INSERT INTO items VALUES (8)")
                await (await conn.execute("SELECT 1 / 0")).fetchone()
        assert usable(conn)
    assert await ids(pool) == []


@pytest.mark.parametrize("runs_before", range(5))
async def test_a_statement_after_an_aborted_pipeline_runs_again(pool: AsyncConnectionPool, runs_before: int) -> None:
    """A statement queued behind a failed one in an aborted pipeline, at the run that prepares it (psycopg
    prepares a statement at its fifth run), was skipped by the server but counted as prepared by psycopg:
    its next run failed with "prepared statement does not exist" (InvalidSqlStatementName). Whatever run
    it was at, it runs again."""
    query = "SELECT 1 / %s::int"
    async with pool.connection() as conn:
        for _ in range(runs_before):
            await conn.execute(query, (1,))
        await conn.commit()
        for divisor in (1, 0):  # failed first, then failing itself
            with pytest.raises(psycopg.errors.DivisionByZero):
                async with sent_together(conn):
                    await conn.execute("SELECT 1 / 0" if divisor else "SELECT 1")
                    await conn.execute(query, (divisor,))
                    await conn.execute(query, (divisor,))
        for _ in range(3):
            async with sent_together(conn):
                await conn.execute(query, (1,))
        assert await (await conn.execute(query, (1,))).fetchone() == (1,)
        await conn.commit()
        assert usable(conn)


async def test_cancelled_mid_exchange_never_leaves_autocommit(pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:

        async def slow() -> None:
            async with sent_together(conn):
                await conn.execute("INSERT INTO items VALUES (9)")
                await (await conn.execute("SELECT pg_sleep(5)")).fetchone()

        task = asyncio.create_task(slow())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Either restored or closed (the pool then replaces it): never lent again in autocommit.
        assert conn.closed or usable(conn)
    assert await ids(pool) == []


async def test_refuses_a_connection_in_a_transaction(pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:
        await conn.execute("SELECT 1")
        with pytest.raises(psycopg.ProgrammingError):
            async with sent_together(conn):
                pass
        assert conn.info.transaction_status == pq.TransactionStatus.INTRANS and not conn.autocommit


async def test_framed_keeps_statements_between_begin_and_commit_together(pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:
        async with framed(conn) as tx:
            async with conn.pipeline():
                await tx.begin()
                await conn.execute("INSERT INTO items VALUES (10)")
            # Outside a pipeline, in autocommit: still inside the one transaction.
            await conn.execute("INSERT INTO items VALUES (11)")
            assert await ids(pool) == []  # another connection sees nothing yet
            async with conn.pipeline():
                await conn.execute("INSERT INTO items VALUES (12)")
                await tx.commit()
        assert usable(conn)
    assert await ids(pool) == [10, 11, 12]


async def test_framed_without_its_commit_keeps_nothing(pool: AsyncConnectionPool) -> None:
    async with pool.connection() as conn:
        async with framed(conn) as tx, conn.pipeline():
            await tx.begin()
            await conn.execute("INSERT INTO items VALUES (13)")
        assert usable(conn)
    assert await ids(pool) == []
