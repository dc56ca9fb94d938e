"""A projection rebuilt from Kafka offset 0 equals the live one."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime

import psycopg
import pytest
from credits_projection import CREDITS, CREDITS_DDL, apply_credit, credited, credits
from google.protobuf import struct_pb2
from niuniu.v1 import events_pb2
from psycopg_pool import AsyncConnectionPool

import backbone.replay.reading
from backbone.consumer import ExactlyOnceConsumer
from backbone.db import open_pool, run_ddl
from backbone.eventstore import EventStore, build_envelope
from backbone.kafka import TopicSpec, ensure_topics, make_consumer, make_producer
from backbone.relay import OutboxRelay
from backbone.replay import replay
from backbone.replay.model import Projection
from backbone.replay.scratch import table_digest
from backbone.replay.writing import REPLAY_SWITCH_INTERVAL_S

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


# A log of credits, one row per event: the exactly-once rules keep ``credit_log_once``. The broken
# variant also wants one row per account, which nothing keeps (accounts are credited several times).
_CREDIT_LOG = "CREATE TABLE IF NOT EXISTS credit_log (event_id UUID NOT NULL, account TEXT NOT NULL, amount BIGINT"
CREDIT_LOG_DDL = (f"{_CREDIT_LOG} NOT NULL, CONSTRAINT credit_log_once UNIQUE (event_id))",)
CREDIT_LOG_PER_ACCOUNT_DDL = (
    f"{_CREDIT_LOG} NOT NULL, CONSTRAINT credit_log_once UNIQUE (event_id),"
    " CONSTRAINT credit_log_account UNIQUE (account))",
)


async def _constraint_exists(conn: psycopg.AsyncConnection, name: str) -> bool:
    cur = await conn.execute(
        "SELECT count(*) FROM pg_constraint k JOIN pg_namespace s ON s.oid = k.connamespace"
        " WHERE k.conname = %s AND s.nspname = current_schema()",
        (name,),
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def _published_credits(pool: AsyncConnectionPool, kafka_servers: str, topic: str, count: int) -> None:
    ensure_topics(kafka_servers, [TopicSpec(topic, partitions=2)])
    store = EventStore("test", topic)
    async with pool.connection() as conn:
        await store.setup(conn)
        async with conn.transaction():
            for i in range(count):
                account = f"acct-{i % 3}"
                await store.append(conn, account, await store.stream_version(conn, account), [credited(account, i)])
    relay = OutboxRelay("test", pool, make_producer(kafka_servers, "relay"))
    while await relay.publish_once():
        pass


async def test_implied_unique_constraints_are_built_when_the_replay_ends_and_checked_there(
    pool: AsyncConnectionPool, dsn: str, kafka_servers: str, unique: str
) -> None:
    topic = f"test.replay.implied.{unique}"
    await _published_credits(pool, kafka_servers, topic, 30)
    seen_while_writing: list[bool] = []
    switch_intervals: set[float] = set()
    switch_interval = sys.getswitchinterval()

    async def log_credit(conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> None:
        switch_intervals.add(sys.getswitchinterval())
        if not seen_while_writing:
            seen_while_writing.append(await _constraint_exists(conn, "credit_log_once"))
        payload = struct_pb2.Struct()
        envelope.payload.Unpack(payload)
        await conn.execute(
            "INSERT INTO credit_log (event_id, account, amount) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            (envelope.event_id, payload.fields["account"].string_value, int(payload.fields["amount"].number_value)),
        )

    log = Projection("credit-log", CREDIT_LOG_DDL, log_credit, ("credit_log",), implied_unique=("credit_log_once",))
    report = await replay(dsn, kafka_servers, [topic], log, f"r_{unique}")
    assert report.events_applied == 30
    assert seen_while_writing == [False]  # taken off while the replay wrote
    # The interpreter lock changed hands more often while the replay ran, and as before after it.
    assert switch_intervals == {REPLAY_SWITCH_INTERVAL_S} and sys.getswitchinterval() == switch_interval
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute(f'SET search_path TO "r_{unique}"')
        assert await _constraint_exists(conn, "credit_log_once")  # and put back at the end
        cur = await conn.execute("SELECT count(*), sum(amount) FROM credit_log")
        assert await cur.fetchone() == (30, sum(range(30)))

        # A constraint the events break (30 credits, 3 accounts) fails the replay where it is put back;
        # applied row by row, ON CONFLICT DO NOTHING would have hidden 27 rows.
        broken = replace(log, ddl=CREDIT_LOG_PER_ACCOUNT_DDL, implied_unique=("credit_log_account",))
        with pytest.raises(psycopg.errors.UniqueViolation):
            await replay(dsn, kafka_servers, [topic], broken, f"s_{unique}")
        # A name the projection does not have is a mistake, not an optimisation quietly skipped.
        with pytest.raises(ValueError, match="credit_log_by_amount"):
            misnamed = replace(log, implied_unique=("credit_log_by_amount",))
            await replay(dsn, kafka_servers, [topic], misnamed, f"t2_{unique}")
        assert sys.getswitchinterval() == switch_interval  # after the failed replays too
        for scratch in (f"r_{unique}", f"s_{unique}", f"t2_{unique}"):
            await conn.execute(f'DROP SCHEMA IF EXISTS "{scratch}" CASCADE')
        await conn.commit()


async def test_events_read_again_in_a_later_poll_or_the_same_one_are_applied_once(
    pool: AsyncConnectionPool, dsn: str, kafka_servers: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll of new events only is recorded by a plain insert; one with an event tracked in an earlier
    poll, or twice in itself, by the statement that skips those: each event counts once either way."""
    topic = f"test.replay.again.{unique}"
    ensure_topics(kafka_servers, [TopicSpec(topic, partitions=1)])
    producer = make_producer(kafka_servers, "again")
    now = datetime.now(UTC)
    envelopes = [
        build_envelope(
            event_id=str(uuid.uuid4()),
            stream_id=f"acct-{i % 3}",
            version=i // 3 + 1,
            event=credited(f"acct-{i % 3}", i + 1),
            occurred_at=now,
            producer="test",
            store_position=i + 1,
        ).SerializeToString()
        for i in range(12)
    ]
    # In polls of (at most) four: 0 1 2 3 all new; 1 4 5 6 with 1 again; 6 7 8 9 with 6 of the poll before;
    # 10 11 11 0 with 11 twice and 0 of the first poll.
    for n in (0, 1, 2, 3, 1, 4, 5, 6, 6, 7, 8, 9, 10, 11, 11, 0):
        producer.send(topic, key=b"k", value=envelopes[n])
    producer.flush()
    producer.close()
    monkeypatch.setattr(backbone.replay.reading, "MAX_REPLAY_POLL_RECORDS", 4)
    report = await replay(dsn, kafka_servers, [topic], CREDITS, f"a_{unique}")
    assert (report.events_read, report.events_applied) == (16, 12)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute(f'SET search_path TO "a_{unique}"')
        expected = {f"acct-{a}": (sum(i + 1 for i in range(12) if i % 3 == a), 4) for a in range(3)}
        assert await credits(conn) == expected
        await conn.execute(f'DROP SCHEMA "a_{unique}" CASCADE')
        await conn.commit()


async def test_replays_running_together_keep_the_quick_switch_until_the_last_ends(
    pool: AsyncConnectionPool, dsn: str, kafka_servers: str, unique: str
) -> None:
    topic = f"test.replay.together.{unique}"
    await _published_credits(pool, kafka_servers, topic, 12)
    switch_interval = sys.getswitchinterval()
    seen: list[float] = []

    async def slow_credit(conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> None:
        seen.append(sys.getswitchinterval())
        await asyncio.sleep(0.01)  # the two replays overlap
        await apply_credit(conn, envelope)

    slow = replace(CREDITS, handler=slow_credit)
    short = replay(dsn, kafka_servers, [topic], CREDITS, f"q1_{unique}")
    long = replay(dsn, kafka_servers, [topic], slow, f"q2_{unique}")
    reports = await asyncio.gather(short, long)
    assert [r.events_applied for r in reports] == [12, 12]
    assert set(seen) == {REPLAY_SWITCH_INTERVAL_S}  # the short one ended first: the long one kept it
    assert sys.getswitchinterval() == switch_interval
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for scratch in (f"q1_{unique}", f"q2_{unique}"):
            await conn.execute(f'DROP SCHEMA IF EXISTS "{scratch}" CASCADE')
        await conn.commit()


# Credits and a row per account that each credit references: the account rows are written only by the
# good handler. ``credit_of_account`` references the primary key (in place all along), ``credit_once``
# references ``account_event`` (an implied unique constraint, taken off while the replay writes).
_ACCOUNTS_DDL = (
    "CREATE TABLE IF NOT EXISTS account_rows (account TEXT PRIMARY KEY, first_event UUID NOT NULL,"
    " CONSTRAINT account_event UNIQUE (first_event))",
    "CREATE TABLE IF NOT EXISTS account_credits (event_id UUID PRIMARY KEY, account TEXT NOT NULL,"
    " first_event UUID,"
    " CONSTRAINT credit_of_account FOREIGN KEY (account) REFERENCES account_rows (account),"
    " CONSTRAINT credit_once FOREIGN KEY (first_event) REFERENCES account_rows (first_event))",
)


async def test_foreign_keys_are_put_back_checked_and_a_replay_that_breaks_one_fails(
    pool: AsyncConnectionPool, dsn: str, kafka_servers: str, unique: str
) -> None:
    topic = f"test.replay.keys.{unique}"
    await _published_credits(pool, kafka_servers, topic, 12)

    async def with_account(conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> None:
        payload = struct_pb2.Struct()
        envelope.payload.Unpack(payload)
        account = payload.fields["account"].string_value
        await conn.execute(
            "INSERT INTO account_rows (account, first_event) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (account, envelope.event_id),
        )
        await conn.execute(
            "INSERT INTO account_credits (event_id, account, first_event)"
            " SELECT %s, account, first_event FROM account_rows WHERE account = %s",
            (envelope.event_id, account),
        )

    async def without_account(conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> None:
        payload = struct_pb2.Struct()
        envelope.payload.Unpack(payload)
        await conn.execute(
            "INSERT INTO account_credits (event_id, account) VALUES (%s, %s)",
            (envelope.event_id, payload.fields["account"].string_value),
        )

    good = Projection(
        "keys", _ACCOUNTS_DDL, with_account, ("account_rows", "account_credits"), implied_unique=("account_event",)
    )
    report = await replay(dsn, kafka_servers, [topic], good, f"k1_{unique}")
    assert report.events_applied == 12
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT k.conname, k.contype, k.convalidated FROM pg_constraint k"
            " JOIN pg_namespace s ON s.oid = k.connamespace WHERE s.nspname = %s AND k.contype IN ('f', 'u')"
            " ORDER BY 1",
            (f"k1_{unique}",),
        )
        assert await cur.fetchall() == [
            ("account_event", "u", True),
            ("credit_of_account", "f", True),
            ("credit_once", "f", True),
        ]
    with pytest.raises(psycopg.errors.ForeignKeyViolation):  # a credit of an account never written
        await replay(dsn, kafka_servers, [topic], replace(good, handler=without_account), f"k2_{unique}")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for scratch in (f"k1_{unique}", f"k2_{unique}"):
            await conn.execute(f'DROP SCHEMA IF EXISTS "{scratch}" CASCADE')
