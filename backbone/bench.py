"""Backbone benchmark: append, publish and consume rates on the real stack.

``niuniu-bench [--events N] [--writers W]`` appends N events through the event store
(``EventStore.append``, with their outbox rows; W connections side by side, each on its
own streams, 100 one-event appends per transaction), then N more with each transaction's
appends and COMMIT pipelined (``append_pipelined``, ``EventStore.append_queued``), then N
more as appends of 10 events each (``append_10_per_call``, 10 appends per transaction, as
a round's settlement appends several events to one stream), publishes all 3N with the
relay, and applies them with an exactly-once consumer (batches of 500) twice: with a
handler of one statement per event (pipelined), and with a batch handler (one statement
per batch, ``backbone.handlers.batched``), printing events/s for each stage. It uses a
scratch schema and topic. It also prints, measured in the same run with the components' own
tools (``backbone.limits``), pgbench's one-row INSERT commits on 16 connections and Kafka's
own producer and consumer on the same topic and record size, so each figure reads as a share
of what the component underneath takes here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Sequence

import psycopg
from google.protobuf import struct_pb2
from niuniu.v1 import events_pb2
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from backbone.consumer import ExactlyOnceConsumer
from backbone.db import open_pool, run_ddl
from backbone.eventstore import EventStore, NewEvent
from backbone.handlers import BatchHandler, Handler, Tracked, batched
from backbone.kafka import TopicSpec, ensure_topics, make_admin, make_consumer, make_producer
from backbone.limits import Limit, kafka_consumer_rate, kafka_producer_rate, pgbench_commits
from backbone.relay import OutboxRelay

EVENTS_PER_TRANSACTION = 100
EVENTS_PER_BATCHED_CALL = 10
STREAMS_PER_WRITER = 50
KAFKA_PROBE_RECORDS = 200_000


async def _apply(conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> None:
    await conn.execute(
        "INSERT INTO bench_counts (stream_id, n) VALUES (%s, 1)"
        " ON CONFLICT (stream_id) DO UPDATE SET n = bench_counts.n + 1",
        (envelope.stream_id,),
    )


async def _apply_many(conn: psycopg.AsyncConnection, batch: Sequence[Tracked]) -> None:
    """``_apply`` of each event in turn, in one statement."""
    counts = Counter(tracked.envelope.stream_id for tracked in batch)
    await conn.execute(
        "INSERT INTO bench_counts (stream_id, n) SELECT * FROM unnest(%b::text[], %b::int[])"
        " ON CONFLICT (stream_id) DO UPDATE SET n = bench_counts.n + EXCLUDED.n",
        (list(counts), list(counts.values())),
    )


async def _append(
    pool: AsyncConnectionPool,
    store: EventStore,
    writer: int,
    events: int,
    *,
    pipelined: bool = False,
    per_call: int = 1,
) -> None:
    """``events`` events in appends of ``per_call`` events, ``EVENTS_PER_TRANSACTION`` events to a transaction.

    ``pipelined``: through ``append_queued`` in pipeline mode (a transaction's appends and its
    COMMIT in one round trip, as the wallet's PlaceHold appends), instead of awaiting each.
    """
    payload = struct_pb2.Struct()
    payload.update({"amount_minor": 100})
    versions: dict[str, int] = {}
    prefix = "p" if pipelined else f"s{per_call}"
    calls = 0
    async with pool.connection() as conn:
        for first in range(0, events, EVENTS_PER_TRANSACTION):
            pipeline = conn.pipeline() if pipelined else contextlib.nullcontext()
            async with pipeline, conn.transaction():
                for at in range(first, min(events, first + EVENTS_PER_TRANSACTION), per_call):
                    stream = f"{prefix}-{writer}-{calls % STREAMS_PER_WRITER}"
                    calls += 1
                    v = versions.get(stream, 0)
                    batch = [NewEvent("bench.happened", payload) for _ in range(min(per_call, events - at))]
                    if pipelined:
                        await store.append_queued(conn, stream, v, batch)
                    else:
                        await store.append(conn, stream, v, batch)
                    versions[stream] = v + len(batch)


async def _consume(
    pool: AsyncConnectionPool, kafka: str, topic: str, name: str, handler: Handler | BatchHandler, total: int
) -> float:
    """Seconds for an exactly-once consumer of its own group to apply ``total`` events of ``topic``."""
    consumer = ExactlyOnceConsumer(
        name, [topic], pool, handler, make_consumer(kafka, name, "bench-consumer"), pipeline=True
    )
    try:
        started, applied = time.perf_counter(), 0
        while applied < total:
            applied += await consumer.poll_once()
        return time.perf_counter() - started
    finally:
        await asyncio.to_thread(consumer._kafka.close)


async def _drop(dsn: str, schema: str, kafka: str, topic: str) -> None:
    """A run's schema and topic, dropped."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    admin = make_admin(kafka, "niuniu-bench")  # with the SASL settings of the environment
    try:
        admin.delete_topics([topic])
    finally:
        admin.close()


async def run(events: int, dsn: str, kafka: str, writers: int = 8) -> tuple[dict[str, float], dict[str, Limit]]:
    """The backbone's rates (events/s), and the same run's limits of the components underneath."""
    tag = uuid.uuid4().hex[:8]
    schema, topic = f"bench_{tag}", f"bench.events.{tag}"
    ensure_topics(kafka, [TopicSpec(topic, partitions=3)])
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    pool = await open_pool(dsn, schema=schema, max_size=max(4, writers + 2))
    store = EventStore("bench", topic)
    try:
        async with pool.connection() as conn:
            await store.setup(conn)
            await ExactlyOnceConsumer.setup(conn)
            await run_ddl(conn, ["CREATE TABLE IF NOT EXISTS bench_counts (stream_id TEXT PRIMARY KEY, n INT)"])
        shares = [events // writers + (1 if w < events % writers else 0) for w in range(writers)]
        started = time.perf_counter()
        await asyncio.gather(*(_append(pool, store, w, n) for w, n in enumerate(shares) if n))
        append_s = time.perf_counter() - started
        started = time.perf_counter()
        await asyncio.gather(*(_append(pool, store, w, n, pipelined=True) for w, n in enumerate(shares) if n))
        append_pipelined_s = time.perf_counter() - started
        started = time.perf_counter()
        await asyncio.gather(
            *(_append(pool, store, w, n, per_call=EVENTS_PER_BATCHED_CALL) for w, n in enumerate(shares) if n)
        )
        append_batched_s = time.perf_counter() - started
        total = 3 * events  # the three append runs' events are published and applied

        relay = OutboxRelay("bench", pool, make_producer(kafka, "bench-relay"), batch_size=1000)
        started = time.perf_counter()
        while await relay.publish_once():
            pass
        publish_s = time.perf_counter() - started

        consume_s = await _consume(pool, kafka, topic, f"bench-{tag}", _apply, total)
        consume_batched_s = await _consume(pool, kafka, topic, f"bench-batched-{tag}", batched(_apply_many), total)

        async with pool.connection() as conn:
            cur = await conn.execute("SELECT avg(length(envelope))::int FROM events")
            row = await cur.fetchone()
        # Kafka's own producer adds records of the events' mean size to the topic (at least
        # KAFKA_PROBE_RECORDS: fewer measure the JVM's warming up), then its consumer reads them all.
        probe = max(total, KAFKA_PROBE_RECORDS)
        size = int(row[0]) if row and row[0] else 100
        limits = {
            "postgres": await pgbench_commits(dsn),
            "kafka_produce": await kafka_producer_rate(kafka, topic, records=probe, record_size=size),
            "kafka_consume": await kafka_consumer_rate(kafka, {topic: total + probe}),
        }
    finally:
        await pool.close()
        await _drop(dsn, schema, kafka, topic)
    return {
        "append_events_per_s": events / append_s,
        "append_pipelined_per_s": events / append_pipelined_s,
        "append_10_per_call_per_s": events / append_batched_s,
        "publish_events_per_s": total / publish_s,
        "consume_events_per_s": total / consume_s,
        "consume_batched_per_s": total / consume_batched_s,
    }, limits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--writers", type=int, default=8, help="connections appending side by side (default 8)")
    args = parser.parse_args()
    if args.events <= 0 or not 1 <= args.writers <= 64:
        parser.error("--events must be positive and --writers 1..64")
    dsn = os.environ.get("DATABASE_URL", "postgresql://niuniu@127.0.0.1:54329/niuniu_test")
    kafka = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    figures, limits = asyncio.run(run(args.events, dsn, kafka, args.writers))
    print(f"backbone benchmark, {args.events} events, {args.writers} writers")
    for name, value in figures.items():
        print(f"  {name:24} {value:10.0f}")
    print("the components underneath, same run, their own tools:")
    postgres, consume, produce = limits["postgres"], limits["kafka_consume"], limits["kafka_produce"]
    print(f"  PostgreSQL   {postgres}")
    print(f"               append = {postgres.ratio(figures['append_events_per_s'])} of it")
    print(f"  Kafka read   {consume}")
    print(f"               batched apply = {consume.ratio(figures['consume_batched_per_s'])} of it")
    print(f"  Kafka write  {produce}")
    print(f"               publish = {produce.ratio(figures['publish_events_per_s'])} of it")


if __name__ == "__main__":
    main()
