"""A projection rebuilt from Kafka offset 0 equals the live one."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import psycopg
import pytest
from credits_projection import CREDITS, CREDITS_DDL, apply_credit, credited
from psycopg_pool import AsyncConnectionPool

from backbone.consumer import ExactlyOnceConsumer
from backbone.db import open_pool, run_ddl
from backbone.eventstore import EventStore
from backbone.kafka import TopicSpec, ensure_topics, make_consumer, make_producer
from backbone.relay import OutboxRelay
from backbone.replay import replay, table_digest

pytestmark = pytest.mark.integration


@pytest.fixture
async def pool(dsn: str, schema: str) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_pool(dsn, schema=schema, max_size=10)
    async with pool.connection() as conn:
        await run_ddl(conn, CREDITS_DDL)
        await ExactlyOnceConsumer.setup(conn)
    yield pool
    await pool.close()


async def test_projection_rebuilt_from_offset_zero_is_identical_to_live(
    pool: AsyncConnectionPool, dsn: str, schema: str, kafka_servers: str, unique: str
) -> None:
    topic = f"test.replay.{unique}"
    ensure_topics(kafka_servers, [TopicSpec(topic, partitions=3)])
    store = EventStore("test", topic)
    async with pool.connection() as conn:
        await store.setup(conn)
        async with conn.transaction():
            for i in range(120):
                account = f"acct-{i % 7}"
                version = await store.stream_version(conn, account)
                await store.append(conn, account, version, [credited(account, (i * 37) % 101 + 1)])
    relay = OutboxRelay("test", pool, make_producer(kafka_servers, "relay"))
    while await relay.publish_once():
        pass
    live = ExactlyOnceConsumer(
        f"live-{unique}", [topic], pool, apply_credit, make_consumer(kafka_servers, f"live-{unique}", "live")
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        await live.poll_once()
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT coalesce(sum(applied), 0) FROM credits")
            row = await cur.fetchone()
            if row and row[0] == 120:
                break

    progress: list[tuple[int, int]] = []
    report = await replay(
        dsn, kafka_servers, [topic], CREDITS, f"r_{unique}", progress=lambda r, t: progress.append((r, t))
    )
    assert report.events_read == 120 and report.events_applied == 120
    assert progress and progress[-1] == (120, 120)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        live_rows = await table_digest(conn, schema, "credits", "account")
        replayed = await table_digest(conn, f"r_{unique}", "credits", "account")
        assert len(live_rows) == 7
        assert replayed == live_rows
        await conn.execute(f'DROP SCHEMA "r_{unique}" CASCADE')
        await conn.commit()
    live._kafka.close()
