"""Is a service's database behind its own topics? Checked at start, before anything appends.

A database restored to an earlier point (a backup, a point in time) no longer holds the
events its relay published after that point: Kafka does. Its rows (balances, holds,
rounds) are as old as its events, and its next append would give a stream a version
that Kafka already carries with other content. So a service starts only when every
record on its own topics (``niuniu.<service>.*``) is an event of its store
(``docs/decisions/0013-restore-behind-kafka.md``).

The check reads each partition of those topics from a checkpoint kept in the service's
own database (``topic_checkpoints``: every record before ``next_offset`` was found in
the store) to the partition's end, and looks each record's event id up in ``events``.
A checkpoint is written only after the records before it were found, in the same
database, so a database restored to any earlier point carries a checkpoint that its
events satisfy, and the records after it are read again. A record whose event is
older than the store's oldest one (``store_position`` below it) counts as pruned into
an archive, not missing: a restore brings back old events, it never loses only them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from kafka import KafkaConsumer, TopicPartition
from niuniu.v1 import events_pb2
from psycopg_pool import AsyncConnectionPool

from backbone.config import ConfigError
from backbone.db import run_ddl
from backbone.kafka import make_consumer
from backbone.topics import Topics

SCHEMA: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS topic_checkpoints (
        topic        TEXT NOT NULL,
        partition    INT NOT NULL,
        next_offset  BIGINT NOT NULL CHECK (next_offset >= 0),
        PRIMARY KEY (topic, partition)
    )
    """,
)
READ_TIMEOUT_S = 120.0
"""Bound on reading one check's records (a check after a long run reads every record since the last start)."""
LOOKUP_BATCH = 1_000
RECOVERY_COMMAND = "scripts/restore --to end"
RUNBOOK = "docs/runbooks/RestoreBehindKafka.md"


@dataclass(frozen=True, slots=True)
class Missing:
    """The first record of the service's topics whose event its store does not hold."""

    topic: str
    partition: int
    offset: int
    stream_id: str
    version: int
    store_position: int


@dataclass(slots=True)
class Report:
    records: int = 0
    missing: int = 0
    first: Missing | None = None
    ends: dict[tuple[str, int], int] = field(default_factory=dict)


def checked_topics(written: Sequence[str], topics: Topics) -> list[str]:
    """Of the topics a service writes, those its check reads: all but the rng's audit topic, which only
    auditors may read (sealed deals); the rng's events topic carries every round it deals too, so a
    database restored behind shows there."""
    return [t for t in written if t != topics.rng_audit]


class BehindTopics(ConfigError):
    """The service's database lacks events its topics carry: it must not serve or append."""

    def __init__(self, service: str, report: Report) -> None:
        first = report.first
        assert first is not None
        super().__init__(
            f"its database is behind its topics: {report.missing} of the {report.records} records read on its own"
            f" topics are events its store does not hold (first: {first.topic}[{first.partition}] offset"
            f" {first.offset}, stream {first.stream_id!r} version {first.version}, store position"
            f" {first.store_position}); it was restored to a point before events it had published. Restore its"
            f" database forward to the end of the WAL archive ({RECOVERY_COMMAND}), check with"
            f" `python -m backbone.recover check {service}`, then start it ({RUNBOOK})"
        )
        self.report = report


async def setup(conn: psycopg.AsyncConnection) -> None:
    await run_ddl(conn, SCHEMA)


async def check(pool: AsyncConnectionPool, bootstrap: str, topics: Sequence[str]) -> Report:
    """Read ``topics`` from their checkpoints and look every record up in the store; when none is
    missing, advance the checkpoints to the ends read."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT topic, partition, next_offset FROM topic_checkpoints WHERE topic = ANY(%s)", (list(topics),)
        )
        starts = {(str(t), int(p)): int(o) for t, p, o in await cur.fetchall()}
        cur = await conn.execute("SELECT min(position) FROM events")
        row = await cur.fetchone()
    oldest = int(row[0]) if row and row[0] is not None else None
    report = Report()
    records = await asyncio.to_thread(_read, bootstrap, topics, starts, report)
    report.records = len(records)
    for i in range(0, len(records), LOOKUP_BATCH):
        await _look_up(pool, records[i : i + LOOKUP_BATCH], oldest, report)
    if report.missing == 0 and report.ends:
        async with pool.connection() as conn, conn.transaction():
            await conn.cursor().executemany(
                "INSERT INTO topic_checkpoints (topic, partition, next_offset) VALUES (%s, %s, %s)"
                " ON CONFLICT (topic, partition) DO UPDATE SET next_offset ="
                " greatest(topic_checkpoints.next_offset, excluded.next_offset)",
                [(t, p, o) for (t, p), o in sorted(report.ends.items())],
            )
    return report


async def refuse_if_behind(pool: AsyncConnectionPool, bootstrap: str, topics: Sequence[str], service: str) -> Report:
    """``check``; raises ``BehindTopics`` (the service refuses to start) when an event is missing."""
    report = await check(pool, bootstrap, topics)
    if report.missing:
        raise BehindTopics(service, report)
    return report


def _read(
    bootstrap: str, topics: Sequence[str], starts: dict[tuple[str, int], int], report: Report
) -> list[tuple[Missing, uuid.UUID]]:
    """Every record of ``topics`` from its partition's checkpoint to the partition's end (as it was
    when the read began), as (where it is and what it says, its event id)."""
    consumer = make_consumer(bootstrap, None, "restore-check")
    try:
        parts = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        if not parts:
            return []
        first, ends = consumer.beginning_offsets(parts), consumer.end_offsets(parts)
        begin = {tp: max(starts.get((tp.topic, tp.partition), 0), first[tp]) for tp in parts}
        report.ends = {(tp.topic, tp.partition): max(begin[tp], ends[tp]) for tp in parts}
        todo = [tp for tp in parts if begin[tp] < ends[tp]]
        consumer.assign(todo)
        for tp in todo:
            consumer.seek(tp, begin[tp])
        return _read_to_ends(consumer, {tp: ends[tp] for tp in todo})
    finally:
        consumer.close()


def _read_to_ends(consumer: KafkaConsumer, ends: dict[TopicPartition, int]) -> list[tuple[Missing, uuid.UUID]]:
    records: list[tuple[Missing, uuid.UUID]] = []
    deadline = time.monotonic() + READ_TIMEOUT_S
    left = dict(ends)
    while left:
        if time.monotonic() > deadline:
            raise TimeoutError(f"reading the service's topics up to {ends} took over {READ_TIMEOUT_S:.0f} s")
        for tp, batch in consumer.poll(timeout_ms=500, max_records=5_000).items():
            for record in batch:
                if record.offset >= ends[tp]:
                    continue
                envelope = events_pb2.EventEnvelope.FromString(record.value)
                where = Missing(
                    tp.topic,
                    tp.partition,
                    record.offset,
                    envelope.stream_id,
                    envelope.stream_version,
                    envelope.store_position,
                )
                records.append((where, uuid.UUID(envelope.event_id)))
            if consumer.position(tp) >= ends[tp]:
                left.pop(tp, None)
                consumer.pause(tp)
    return records


async def _look_up(
    pool: AsyncConnectionPool, records: Sequence[tuple[Missing, uuid.UUID]], oldest: int | None, report: Report
) -> None:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT event_id FROM events WHERE event_id = ANY(%s)", ([event_id for _, event_id in records],)
        )
        held = {row[0] for row in await cur.fetchall()}
    for where, event_id in records:
        if event_id in held or (oldest is not None and 0 < where.store_position < oldest):
            continue
        report.missing += 1
        if report.first is None or (where.topic, where.partition, where.offset) < (
            report.first.topic,
            report.first.partition,
            report.first.offset,
        ):
            report.first = where
