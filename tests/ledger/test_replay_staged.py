"""The replay's staged path (a whole poll staged with COPY) has the effects of the handler event by event,
and so do the live consumers, which write each batch with it.

The same records are replayed twice from Kafka: once by the journal projection as the audit runs
it (``stage_journal``), once with the stager taken off, so the replay applies ``apply`` to one event
after another. Every table must come out identical, including the awkward cases: an event
published twice, a movement id reused by a later event, a round settled twice, a movement that
does not balance and one whose id repeats within its event.
"""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from niuniu.table.v1 import events_pb2 as table_pb2
from niuniu.wallet.v1 import events_pb2 as wallet_pb2
from psycopg import sql

import backbone.replay.writing
from backbone.consumer import ExactlyOnceConsumer
from backbone.db import open_pool, run_ddl
from backbone.eventstore import NewEvent, build_envelope
from backbone.kafka import TopicSpec, ensure_topics, make_consumer, make_producer
from backbone.replay import replay
from backbone.replay.scratch import plain_indexes, table_digest
from backbone.topics import Topics
from services.ledger.projection import (
    CONSUMER,
    DDL,
    JOURNAL,
    ROUND_EVENT_TYPES,
    ROUNDS_CONSUMER,
    journal_batch,
    rounds_batch,
)
from services.ledger.synthetic import AVAILABLE, HELD, SyntheticStream, leg, movement

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0

# Each table in a stable order; ``seq`` (journal order across partitions, as the polls interleave
# them) is left out.
ORDER = {
    "journal_entries": "entry_id",
    "journal_lines": "entry_id, line_no",
    "balances": "account, bucket",
    "journal_rejects": "event_id, movement_index",
    "rounds": "round_id",
    "round_bets": "round_id, bet_id",
}


def _awkward() -> list[tuple[str, str, NewEvent]]:
    """(target, stream id, event): a movement id reused, a round settled twice, refused movements.

    Each pair that must keep its first copy shares a stream (a Kafka key: one partition, in order)."""
    deposit = movement("dep-x", "deposit", leg("external:cashier", AVAILABLE, -500), leg("player:p0", AVAILABLE, 500))
    reused = movement("dep-x", "deposit", leg("external:cashier", AVAILABLE, -7), leg("player:p1", AVAILABLE, 7))
    unbalanced = movement("bad-1", "loss", leg("player:p0", HELD, -100), leg("house", AVAILABLE, 90))
    twice = movement("twice", "deposit", leg("external:cashier", AVAILABLE, -3), leg("player:p2", AVAILABLE, 3))
    settled = table_pb2.RoundSettled(table_id="table-9", round_id="round-x", variant="golden_bull")
    again = table_pb2.RoundSettled(table_id="table-9", round_id="round-x", variant="baibian_bull")
    return [
        ("wallet", "account-p0", NewEvent("wallet.deposited", wallet_pb2.Deposited(movement=deposit))),
        ("wallet", "account-p0", NewEvent("wallet.deposited", wallet_pb2.Deposited(movement=reused))),
        (
            "wallet",
            "settlement-round-x",
            NewEvent(
                "wallet.round_settlement_applied",
                wallet_pb2.RoundSettlementApplied(round_id="round-x", movements=[unbalanced, twice, twice]),
                correlation_id="round-x",
            ),
        ),
        ("table", "table-9", NewEvent("table.round_settled", settled, correlation_id="round-x")),
        ("table", "table-9", NewEvent("table.round_settled", again, correlation_id="round-x")),
    ]


async def _rows(conn: psycopg.AsyncConnection, schema: str, table: str, order: str) -> list[tuple[object, ...]]:
    rows = await table_digest(conn, schema, table, order)
    if table != "journal_entries":
        return rows
    cur = await conn.execute(sql.SQL("SELECT * FROM {}.journal_entries LIMIT 0").format(sql.Identifier(schema)))
    seq = [c.name for c in cur.description or ()].index("seq")
    return [row[:seq] + row[seq + 1 :] for row in rows]


def _publish(kafka_servers: str, topics: Topics, *, awkward: bool = True) -> list[tuple[str, str, NewEvent]]:
    """The synthetic stream with the awkward cases, some events twice (``awkward``; else each event once
    and nothing awkward); returns the distinct events."""
    ensure_topics(kafka_servers, [TopicSpec(topics.wallet_events, 3), TopicSpec(topics.table_events, 3)])
    items = [(s.target, s.stream_id, s.event) for s in SyntheticStream(seed=5, players=4).events(300)]
    if awkward:
        items[150:150] = _awkward()
    producer = make_producer(kafka_servers, "test-replay-staged")
    versions: dict[str, int] = {}
    now = datetime.now(UTC)
    for position, (target, stream_id, event) in enumerate(items, start=1):
        versions[stream_id] = versions.get(stream_id, 0) + 1
        envelope = build_envelope(
            event_id=str(uuid.uuid4()),
            stream_id=stream_id,
            version=versions[stream_id],
            event=event,
            occurred_at=now,
            producer=target,
            store_position=position,
        )
        topic = topics.wallet_events if target == "wallet" else topics.table_events
        copies = 2 if awkward and position % 50 == 0 else 1  # some events published twice (a relay retry)
        for _ in range(copies):
            producer.send(topic, key=stream_id.encode(), value=envelope.SerializeToString())
    producer.flush()
    producer.close()
    return items


async def _index_names(conn: psycopg.AsyncConnection, schema: str) -> set[str]:
    cur = await conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,))
    return {str(r[0]) for r in await cur.fetchall()}


async def _constraint_names(conn: psycopg.AsyncConnection, schema: str) -> set[str]:
    cur = await conn.execute(
        "SELECT k.conname FROM pg_constraint k JOIN pg_namespace s ON s.oid = k.connamespace WHERE s.nspname = %s",
        (schema,),
    )
    return {str(r[0]) for r in await cur.fetchall()}


@pytest.mark.parametrize("awkward", [True, False], ids=["awkward", "all-new"])
async def test_staged_replay_equals_the_handler_event_by_event(
    dsn: str, kafka_servers: str, unique: str, awkward: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the awkward cases every poll is written the careful way; without them, each poll goes in
    with plain inserts on the first try (``StagedBatch.write_all_new``)."""
    careful: list[int] = []
    apply_carefully = backbone.replay.writing._apply_carefully

    async def counted(*args: Any) -> int:
        careful.append(1)
        return await apply_carefully(*args)

    monkeypatch.setattr(backbone.replay.writing, "_apply_carefully", counted)
    topics = Topics(f"t{unique}.")
    count = len(_publish(kafka_servers, topics, awkward=awkward))
    names = [topics.wallet_events, topics.table_events]
    staged, one_by_one = f"rs_{unique}", f"rh_{unique}"
    try:
        first = await replay(dsn, kafka_servers, names, JOURNAL, staged)
        assert bool(careful) is awkward
        second = await replay(
            dsn, kafka_servers, names, dataclasses.replace(JOURNAL, stager=None), one_by_one, indexes=False
        )
        assert first.events_read == second.events_read == count + (count // 50 if awkward else 0)
        assert first.events_applied == second.events_applied == count
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            for table, order in ORDER.items():
                rows, other = await _rows(conn, staged, table, order), await _rows(conn, one_by_one, table, order)
                assert rows == other, table
                assert rows or (table == "journal_rejects" and not awkward), table
            # The second replay left the plain indexes out (as the audit's does); the constraints are
            # there either way.
            plain = {re.search(r"EXISTS (\w+)", s).group(1) for s in plain_indexes(JOURNAL)}  # type: ignore[union-attr]
            assert len(plain) == 6
            built, left_out = await _index_names(conn, staged), await _index_names(conn, one_by_one)
            assert plain <= built and not plain & left_out and built - plain == left_out
            assert await _constraint_names(conn, staged) == await _constraint_names(conn, one_by_one)
            assert {"journal_entries_seq_key", "journal_lines_entry_id_fkey"} <= await _constraint_names(conn, staged)
            if not awkward:
                return
            cur = await conn.execute(
                sql.SQL("SELECT reason, entry_id FROM {}.journal_rejects ORDER BY 2, 1").format(sql.Identifier(staged))
            )
            assert await cur.fetchall() == [
                ("UNBALANCED", "bad-1"),
                ("DUPLICATE_ENTRY_ID", "dep-x"),
                ("DUPLICATE_ENTRY_ID", "twice"),
            ]
            cur = await conn.execute(
                sql.SQL("SELECT variant FROM {}.rounds WHERE round_id = 'round-x'").format(sql.Identifier(staged))
            )
            assert await cur.fetchall() == [("golden_bull",)]
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for schema in (staged, one_by_one):
                await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def test_the_live_consumers_journal_as_the_handler_does_event_by_event(
    dsn: str, kafka_servers: str, unique: str
) -> None:
    """The ledger's two live consumers (batches written by the staged writer) against the same records
    replayed one event at a time: every table identical."""
    topics = Topics(f"t{unique}.")
    items = _publish(kafka_servers, topics)
    wallet_events = sum(target == "wallet" for target, _, _ in items)
    round_events = sum(event.event_type in ROUND_EVENT_TYPES for _, _, event in items)
    names = [topics.wallet_events, topics.table_events]
    live, one_by_one = f"rl_{unique}", f"rh_{unique}"
    try:
        await replay(dsn, kafka_servers, names, dataclasses.replace(JOURNAL, stager=None), one_by_one)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(live)))
        pool = await open_pool(dsn, schema=live, max_size=4)
        try:
            async with pool.connection() as conn:
                await ExactlyOnceConsumer.setup(conn)
                await run_ddl(conn, DDL)
            consumers = [
                ExactlyOnceConsumer(
                    name, [topic], pool, handler, make_consumer(kafka_servers, f"g{unique}-{name}", name)
                )
                for name, topic, handler in (
                    (CONSUMER, topics.wallet_events, journal_batch),
                    (ROUNDS_CONSUMER, topics.table_events, rounds_batch),
                )
            ]
            applied, deadline = 0, time.monotonic() + DEADLINE_S
            while applied < wallet_events + round_events:
                assert time.monotonic() < deadline, f"applied {applied} of {wallet_events + round_events}"
                applied += sum([await consumer.poll_once() for consumer in consumers])
            for _ in range(3):  # the copies published twice, if any were still to come
                assert sum([await consumer.poll_once() for consumer in consumers]) == 0
            for consumer in consumers:
                consumer._kafka.close()
        finally:
            await pool.close()
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            for table, order in ORDER.items():
                rows, other = await _rows(conn, live, table, order), await _rows(conn, one_by_one, table, order)
                assert rows == other, table
                assert rows
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for schema in (live, one_by_one):
                await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
