"""Backbone benchmark: append, publish and consume rates on the real stack.

``niuniu-bench [--events N]`` appends N events through the event store (with their
outbox rows), publishes them with the relay, and applies them with an exactly-once
consumer, printing events/s for each stage. It uses a scratch schema and topic.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

import psycopg
from google.protobuf import struct_pb2
from niuniu.v1 import events_pb2
from psycopg import sql

from backbone.consumer import ExactlyOnceConsumer
from backbone.db import open_pool, run_ddl
from backbone.eventstore import EventStore, NewEvent
from backbone.kafka import TopicSpec, ensure_topics, make_consumer, make_producer
from backbone.relay import OutboxRelay

EVENTS_PER_TRANSACTION = 100


async def _apply(conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> None:
    await conn.execute(
        "INSERT INTO bench_counts (stream_id, n) VALUES (%s, 1)"
        " ON CONFLICT (stream_id) DO UPDATE SET n = bench_counts.n + 1",
        (envelope.stream_id,),
    )


async def run(events: int, dsn: str, kafka: str) -> dict[str, float]:
    tag = uuid.uuid4().hex[:8]
    schema, topic = f"bench_{tag}", f"bench.events.{tag}"
    ensure_topics(kafka, [TopicSpec(topic, partitions=3)])
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    pool = await open_pool(dsn, schema=schema)
    store = EventStore("bench", topic)
    try:
        async with pool.connection() as conn:
            await store.setup(conn)
            await ExactlyOnceConsumer.setup(conn)
            await run_ddl(conn, ["CREATE TABLE IF NOT EXISTS bench_counts (stream_id TEXT PRIMARY KEY, n INT)"])
        payload = struct_pb2.Struct()
        payload.update({"amount_minor": 100})
        started = time.perf_counter()
        versions: dict[str, int] = {}
        async with pool.connection() as conn:
            for first in range(0, events, EVENTS_PER_TRANSACTION):
                async with conn.transaction():
                    for i in range(first, min(events, first + EVENTS_PER_TRANSACTION)):
                        stream = f"s-{i % 50}"
                        v = versions.get(stream, 0)
                        await store.append(conn, stream, v, [NewEvent("bench.happened", payload)])
                        versions[stream] = v + 1
        append_s = time.perf_counter() - started

        relay = OutboxRelay("bench", pool, make_producer(kafka, "bench-relay"), batch_size=1000)
        started = time.perf_counter()
        while await relay.publish_once():
            pass
        publish_s = time.perf_counter() - started

        consumer = ExactlyOnceConsumer(
            f"bench-{tag}", [topic], pool, _apply, make_consumer(kafka, f"bench-{tag}", "bench-consumer")
        )
        started, applied = time.perf_counter(), 0
        while applied < events:
            applied += await consumer.poll_once()
        consume_s = time.perf_counter() - started
        await asyncio.to_thread(consumer._kafka.close)
    finally:
        await pool.close()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return {
        "append_events_per_s": events / append_s,
        "publish_events_per_s": events / publish_s,
        "consume_events_per_s": events / consume_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10_000)
    args = parser.parse_args()
    dsn = os.environ.get("DATABASE_URL", "postgresql://niuniu@127.0.0.1:54329/niuniu_test")
    kafka = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    figures = asyncio.run(run(args.events, dsn, kafka))
    print(f"backbone benchmark, {args.events} events")
    for name, value in figures.items():
        print(f"  {name:24} {value:10.0f}")


if __name__ == "__main__":
    main()
