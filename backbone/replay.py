"""Rebuild a projection from Kafka offset 0 into fresh tables.

A projection is the pair (DDL, handler). The live consumer applies the handler
in the service's schema; a replay creates a fresh PostgreSQL schema, reads every
partition of the topics from the beginning up to the end offsets seen when it
started, and applies the same handler with the same exactly-once rules. The
two results can then be compared table by table.

A replay works a poll (up to 2 000 records) at a time: the envelopes are decoded
together, their tracking rows staged with COPY and written in one statement, and the events applied in
one transaction — by the projection's ``batch_handler`` when it has one (the same
effects as the handler applied event by event, in order, in a few statements), else
by the handler with the statements pipelined.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import psycopg
from kafka import TopicPartition
from niuniu.v1 import events_pb2
from psycopg import sql

from backbone.consumer import TRACKING_SCHEMA, Handler, canonical_event_id
from backbone.db import create_schema, run_ddl
from backbone.kafka import make_consumer

MAX_REPLAY_POLL_RECORDS = 2_000


@dataclass(frozen=True, slots=True)
class Tracked:
    """An event with the Kafka position it was read from."""

    envelope: events_pb2.EventEnvelope
    topic: str
    partition: int
    offset: int


BatchHandler = Callable[[psycopg.AsyncConnection, Sequence[Tracked]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Projection:
    name: str
    ddl: Sequence[str]
    handler: Handler
    tables: Sequence[str]
    # Optional: applies several events (new ones, in order) with the effects of ``handler`` on each.
    batch_handler: BatchHandler | None = None


@dataclass(frozen=True, slots=True)
class ReplayReport:
    schema: str
    events_read: int
    events_applied: int
    seconds: float


async def replay(
    dsn: str,
    bootstrap_servers: str,
    topics: Sequence[str],
    projection: Projection,
    schema: str,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayReport:
    """Rebuild ``projection`` from offset 0 of ``topics`` into the fresh ``schema``."""
    started = time.perf_counter()
    consumer = make_consumer(
        bootstrap_servers, None, f"replay-{projection.name}", max_poll_records=MAX_REPLAY_POLL_RECORDS
    )
    try:
        partitions = [
            TopicPartition(topic, p) for topic in topics for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        total = sum(end.values())
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await create_schema(conn, schema, fresh=True)
            await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
            await conn.commit()
            await run_ddl(conn, [*TRACKING_SCHEMA, *projection.ddl])
            read, applied = await _drain(consumer, conn, projection, end, total, progress)
    finally:
        consumer.close()
    return ReplayReport(schema, read, applied, time.perf_counter() - started)


async def _drain(
    consumer: object,
    conn: psycopg.AsyncConnection,
    projection: Projection,
    end: dict[TopicPartition, int],
    total: int,
    progress: Callable[[int, int], None] | None,
) -> tuple[int, int]:
    read = applied = 0
    remaining = {tp for tp, offset in end.items() if offset > 0}
    while remaining:
        batches = await asyncio.to_thread(consumer.poll, 500)  # type: ignore[attr-defined]
        polled: list[Tracked] = []
        for tp, records in batches.items():
            for record in records:
                if record.offset >= end[tp]:
                    remaining.discard(tp)
                    break
                polled.append(Tracked(_decode(record.value), tp.topic, tp.partition, record.offset))
                if record.offset + 1 >= end[tp]:
                    remaining.discard(tp)
        if polled:
            read += len(polled)
            async with conn.transaction():
                applied += await _apply(conn, projection, polled)
        for tp in list(remaining):
            if await asyncio.to_thread(consumer.position, tp) >= end[tp]:  # type: ignore[attr-defined]
                remaining.discard(tp)
        if progress is not None:
            progress(read, total)
    return read, applied


def _decode(value: bytes) -> events_pb2.EventEnvelope:
    envelope = events_pb2.EventEnvelope()
    envelope.ParseFromString(value)
    return envelope


async def _apply(conn: psycopg.AsyncConnection, projection: Projection, polled: list[Tracked]) -> int:
    """Record ``polled`` as processed (one statement) and apply the new ones; returns how many were new."""
    await conn.execute(
        "CREATE TEMP TABLE IF NOT EXISTS replay_polled"
        ' (n INT, event_id UUID, topic TEXT, partition INT, "offset" BIGINT) ON COMMIT DELETE ROWS'
    )
    cur = conn.cursor()
    async with cur.copy('COPY replay_polled (n, event_id, topic, partition, "offset") FROM STDIN') as copy:
        for n, tracked in enumerate(polled):
            await copy.write_row((n, tracked.envelope.event_id, tracked.topic, tracked.partition, tracked.offset))
    await cur.execute(
        'INSERT INTO processed_events (consumer, event_id, topic, partition, "offset")'
        ' SELECT %s, event_id, topic, partition, "offset" FROM replay_polled ORDER BY n'
        " ON CONFLICT DO NOTHING RETURNING event_id",
        (projection.name,),
    )
    new = {str(row[0]) for row in await cur.fetchall()}
    fresh: list[Tracked] = []
    for tracked in polled:
        event_id = canonical_event_id(tracked.envelope.event_id)
        if event_id in new:
            new.discard(event_id)  # published twice: the first copy only
            fresh.append(tracked)
    if projection.batch_handler is not None:
        await projection.batch_handler(conn, fresh)
    else:
        async with conn.pipeline():
            for tracked in fresh:
                await projection.handler(conn, tracked.envelope)
    return len(fresh)


async def table_digest(
    conn: psycopg.AsyncConnection, schema: str, table: str, order_by: str
) -> list[tuple[object, ...]]:
    """Every row of ``schema.table`` in a stable order, for comparing a replay with the live projection."""
    query = sql.SQL("SELECT * FROM {}.{} ORDER BY {}").format(
        sql.Identifier(schema), sql.Identifier(table), sql.SQL(order_by)
    )
    cur = await conn.execute(query)
    return list(await cur.fetchall())
