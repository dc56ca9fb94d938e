"""Contract tests of the PostgreSQL event store (real PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from credits_projection import credited
from google.protobuf import struct_pb2
from niuniu.v1 import events_pb2
from psycopg_pool import AsyncConnectionPool

from backbone.db import open_pool
from backbone.eventstore import ConcurrencyError, EventStore, with_store_position

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


async def test_appends_to_other_ordering_domains_do_not_wait_for_an_open_transaction(
    pool: AsyncConnectionPool, store: EventStore
) -> None:
    release = asyncio.Event()
    appended = asyncio.Event()

    async def slow_writer() -> None:
        async with pool.connection() as conn, conn.transaction():
            await store.append(conn, "table-1", 0, [credited("a", 1)])
            appended.set()
            await release.wait()

    slow = asyncio.create_task(slow_writer())
    await appended.wait()
    # Another domain appends and commits while table-1's transaction is still open
    # (a store-wide lock held to commit would block here; the timeout turns that into a failure).
    async with pool.connection() as conn:
        await asyncio.wait_for(store.append(conn, "account-7", 0, [credited("b", 2)]), timeout=30)
    release.set()
    await slow


async def test_one_domain_commits_in_position_order_so_a_reader_following_it_never_skips(
    pool: AsyncConnectionPool, store: EventStore
) -> None:
    release = asyncio.Event()
    appended = asyncio.Event()

    async def first() -> int:
        async with pool.connection() as conn, conn.transaction():
            (event,) = await store.append(conn, "table-2", 0, [credited("a", 1)])
            appended.set()
            await release.wait()
        return event.position

    async def second() -> int:
        async with pool.connection() as conn, conn.transaction():
            (event,) = await store.append(conn, "table-2.bet-9", 0, [credited("b", 2)])
        return event.position

    a = asyncio.create_task(first())
    await appended.wait()
    b = asyncio.create_task(second())
    await asyncio.sleep(0.3)
    assert not b.done()  # the bet stream is in table-2's domain: it waits for the open append
    release.set()
    first_position, second_position = await a, await b
    assert first_position < second_position


async def test_read_all_waits_for_appends_in_flight_so_it_returns_a_prefix_of_positions(
    pool: AsyncConnectionPool, store: EventStore
) -> None:
    release = asyncio.Event()
    appended = asyncio.Event()

    async def open_append() -> None:
        async with pool.connection() as conn, conn.transaction():
            await store.append(conn, "early", 0, [credited("a", 1)])
            appended.set()
            await release.wait()

    held = asyncio.create_task(open_append())
    await appended.wait()
    async with pool.connection() as conn:
        await store.append(conn, "late", 0, [credited("b", 2)])  # a larger position, committed first

    async def read() -> list[str]:
        async with pool.connection() as conn:
            return [e.stream_id for e in await store.read_all(conn)]

    reader = asyncio.create_task(read())
    await asyncio.sleep(0.3)
    assert not reader.done()  # it does not return "late" without "early"
    release.set()
    await held
    assert await reader == ["early", "late"]


async def test_envelopes_carry_their_store_position_when_read_and_when_published(
    pool: AsyncConnectionPool, store: EventStore
) -> None:
    async with pool.connection() as conn:
        (appended,) = await store.append(conn, "pos", 0, [credited("a", 1)])
        (read,) = await store.read_stream(conn, "pos")
        cur = await conn.execute("SELECT envelope FROM events WHERE position = %s", (appended.position,))
        row = await cur.fetchone()
    assert appended.envelope.store_position == read.envelope.store_position == read.position == appended.position
    assert row is not None
    published = events_pb2.EventEnvelope.FromString(with_store_position(bytes(row[0]), appended.position))
    assert published == read.envelope


TEXT_ARRAY_SPECIALS = 'a "quoted", {braced} \\ back\\slash\x00 NULL\n é'


@pytest.mark.parametrize("queued", [False, True], ids=["awaited", "queued_in_a_pipeline"])
async def test_an_append_of_several_events_stores_each_envelope_byte_for_byte(
    pool: AsyncConnectionPool, store: EventStore, queued: bool
) -> None:
    """The several-event append sends its columns as arrays (binary since they were slow as text): every
    envelope, correlation id and topic comes back as sent, whatever bytes and characters it holds."""
    specials = TEXT_ARRAY_SPECIALS.replace("\x00", "")  # PostgreSQL text holds no NUL; bytea does
    events = [credited(TEXT_ARRAY_SPECIALS + str(i), i, correlation_id=f"{specials} {i}") for i in range(3)]
    async with pool.connection() as conn:
        if queued:
            async with conn.pipeline(), conn.transaction():
                await store.append_queued(conn, "bytes", 0, events)
        else:
            async with conn.transaction():
                await store.append(conn, "bytes", 0, events)
        stored = await store.read_stream(conn, "bytes")
        cur = await conn.execute(
            "SELECT e.envelope, e.correlation_id, o.topic FROM events e JOIN outbox o USING (position)"
            " WHERE e.stream_id = 'bytes' ORDER BY e.version"
        )
        rows = await cur.fetchall()
    assert [e.envelope.correlation_id for e in stored] == [f"{specials} {i}" for i in range(3)]
    for i, (event, (raw, correlation, topic)) in enumerate(zip(stored, rows, strict=True)):
        envelope = events_pb2.EventEnvelope.FromString(bytes(raw))
        payload = struct_pb2.Struct()
        envelope.payload.Unpack(payload)
        assert payload.fields["account"].string_value == TEXT_ARRAY_SPECIALS + str(i)
        assert (correlation, topic) == (f"{specials} {i}", "test.events")
        assert envelope.event_id == event.envelope.event_id
