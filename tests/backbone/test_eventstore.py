"""Contract tests of the PostgreSQL event store (real PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from credits_projection import credited
from psycopg_pool import AsyncConnectionPool

from backbone.db import open_pool
from backbone.eventstore import ConcurrencyError, EventStore

pytestmark = pytest.mark.integration


@pytest.fixture
async def pool(dsn: str, schema: str) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_pool(dsn, schema=schema, max_size=10)
    yield pool
    await pool.close()


@pytest.fixture
async def store(pool: AsyncConnectionPool) -> EventStore:
    store = EventStore("test", "test.events")
    async with pool.connection() as conn:
        await store.setup(conn)
    return store


async def test_append_then_read_stream_in_version_order(pool: AsyncConnectionPool, store: EventStore) -> None:
    async with pool.connection() as conn, conn.transaction():
        await store.append(conn, "acct-1", 0, [credited("a", 1), credited("a", 2)])
        await store.append(conn, "acct-1", 2, [credited("a", 3)])
    async with pool.connection() as conn:
        events = await store.read_stream(conn, "acct-1")
        assert [e.version for e in events] == [1, 2, 3]
        assert [e.envelope.producer for e in events] == ["test"] * 3
        assert len({e.envelope.event_id for e in events}) == 3
        assert await store.stream_version(conn, "acct-1") == 3
        assert [e.version for e in await store.read_stream(conn, "acct-1", after_version=1)] == [2, 3]


async def test_two_concurrent_appends_at_the_same_version_exactly_one_wins(
    pool: AsyncConnectionPool, store: EventStore
) -> None:
    start = asyncio.Event()

    async def append(amount: int) -> str:
        async with pool.connection() as conn:
            await start.wait()
            try:
                async with conn.transaction():
                    await store.append(conn, "race", 0, [credited("r", amount)])
                    await asyncio.sleep(0.05)  # keep the transaction open while the other one tries
                return "won"
            except ConcurrencyError:
                return "lost"

    tasks = [asyncio.create_task(append(n)) for n in (1, 2)]
    await asyncio.sleep(0.05)
    start.set()
    results = sorted(await asyncio.gather(*tasks))
    assert results == ["lost", "won"]
    async with pool.connection() as conn:
        assert len(await store.read_stream(conn, "race")) == 1


async def test_stale_expected_version_is_rejected(pool: AsyncConnectionPool, store: EventStore) -> None:
    async with pool.connection() as conn, conn.transaction():
        await store.append(conn, "s", 0, [credited("a", 1)])
    async with pool.connection() as conn:
        with pytest.raises(ConcurrencyError):
            async with conn.transaction():
                await store.append(conn, "s", 0, [credited("a", 1)])
        with pytest.raises(ConcurrencyError):
            async with conn.transaction():
                await store.append(conn, "s", 5, [credited("a", 1)])


async def test_rolled_back_state_change_leaves_neither_event_nor_outbox_row(
    pool: AsyncConnectionPool, store: EventStore
) -> None:
    async with pool.connection() as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await store.append(conn, "gone", 0, [credited("a", 1)])
                raise RuntimeError("the state change failed")
        cur = await conn.execute("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM outbox)")
        assert await cur.fetchone() == (0, 0)


async def test_read_all_follows_positions_and_outbox_records_topic_and_key(
    pool: AsyncConnectionPool, store: EventStore
) -> None:
    async with pool.connection() as conn, conn.transaction():
        await store.append(conn, "x", 0, [credited("a", 1)])
        ev = credited("b", 2)
        await store.append(conn, "y", 0, [type(ev)(ev.event_type, ev.payload, topic="test.audit")])
    async with pool.connection() as conn:
        everything = await store.read_all(conn)
        assert [e.stream_id for e in everything] == ["x", "y"]
        assert everything[0].position < everything[1].position
        assert [e.stream_id for e in await store.read_all(conn, after_position=everything[0].position)] == ["y"]
        cur = await conn.execute("SELECT topic, record_key FROM outbox ORDER BY position")
        assert await cur.fetchall() == [("test.events", "x"), ("test.audit", "y")]
