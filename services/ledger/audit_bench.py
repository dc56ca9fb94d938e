"""``niuniu-audit bench-replay``: the replay's speed on synthetic events in scratch topics, with the same run's
reference rates (kafka-python alone, Kafka's own consumer, pgbench's commits)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TextIO

from kafka import TopicPartition
from niuniu.v1 import events_pb2

from backbone.eventstore import build_envelope
from backbone.kafka import TopicSpec, ensure_topics, make_admin, make_producer
from backbone.limits import Limit, kafka_consumer_rate, pgbench_commits
from backbone.replay import replay
from backbone.replay.model import ReplayReport
from backbone.replay.reading import replay_consumer
from backbone.replay.scratch import build_indexes, plain_indexes
from backbone.replay.workers import ready_workers
from backbone.topics import Topics
from services.ledger.audit_scratch import connect, drop_schema
from services.ledger.projection import JOURNAL
from services.ledger.synthetic import SyntheticStream


@dataclass(frozen=True, slots=True)
class WorkersReport:
    """A replay of the benchmark's events by ``workers`` processes (``--workers``)."""

    workers: int
    replay: ReplayReport
    entries: int


@dataclass(frozen=True, slots=True)
class BenchReport:
    replay: ReplayReport  # as ``niuniu-audit replay`` replays: the journal's plain indexes not built
    entries: int
    indexes_seconds: float  # building those indexes afterwards, as a replay kept (``--keep``) builds them
    # Measured in the same run: kafka-python alone reading and parsing the same records (records/s,
    # with the replay's consumer settings), Kafka's own consumer reading them, and pgbench's one-row
    # INSERT commits (16 connections).
    kafka_parse_per_s: float
    kafka_read: Limit
    postgres: Limit
    # With ``--workers``: the same events replayed by each number of worker processes, instead of the above.
    by_workers: tuple[WorkersReport, ...] = ()


async def bench_replay(
    events: int, dsn: str, kafka: str, workers: Sequence[int] = (), cpu_per_worker: float = 0.0
) -> BenchReport:
    """Replay ``events`` synthetic events from scratch topics, with the same run's reference rates: in this
    process, or (``workers``) by each number of worker processes in turn, each held to ``cpu_per_worker``."""
    tag = uuid.uuid4().hex[:8]
    topics = Topics(f"bench{tag}.")
    specs = [TopicSpec(topics.wallet_events, partitions=6), TopicSpec(topics.table_events, partitions=6)]
    ensure_topics(kafka, specs)
    schema = f"ledger_bench_{tag}"
    names = [topics.wallet_events, topics.table_events]
    if workers:
        ready_workers(JOURNAL)  # started once, before the runs: none of them pays for it
    try:
        produced = _produce_synthetic(kafka, topics, events)
        by_workers = tuple([await _bench_workers(dsn, kafka, names, schema, n, cpu_per_worker) for n in workers])
        if by_workers:
            report, entries, indexes_seconds = by_workers[0].replay, by_workers[0].entries, float("nan")
        else:
            report = await replay(dsn, kafka, names, JOURNAL, schema, indexes=False)
            started = time.perf_counter()
            await build_indexes(dsn, schema, plain_indexes(JOURNAL))
            indexes_seconds = time.perf_counter() - started
            entries = await _entries(dsn, schema)
        kafka_rate = await asyncio.to_thread(kafka_parse_rate, kafka, names)
        kafka_read = await kafka_consumer_rate(kafka, produced)
        postgres = await pgbench_commits(dsn)
        return BenchReport(report, entries, indexes_seconds, kafka_rate, kafka_read, postgres, by_workers)
    finally:
        await drop_schema(dsn, schema)
        admin = make_admin(kafka, "niuniu-audit-bench")
        try:
            admin.delete_topics([s.name for s in specs])
        finally:
            admin.close()


async def _bench_workers(
    dsn: str, kafka: str, names: Sequence[str], schema: str, workers: int, cpu_per_worker: float
) -> WorkersReport:
    """The benchmark's replay by ``workers`` processes, into a schema of its own (dropped afterwards)."""
    mine = f"{schema}_w{workers}"
    try:
        report = await replay(
            dsn, kafka, names, JOURNAL, mine, indexes=False, workers=workers, cpu_per_worker=cpu_per_worker
        )
        return WorkersReport(workers, report, await _entries(dsn, mine))
    finally:
        await drop_schema(dsn, mine)


async def _entries(dsn: str, schema: str) -> int:
    conn = await connect(dsn, schema)
    async with conn:
        cur = await conn.execute("SELECT count(*) FROM journal_entries")
        row = await cur.fetchone()
    return int(row[0]) if row else 0


def kafka_parse_rate(kafka: str, topics: Sequence[str]) -> float:
    """Records/s kafka-python alone reads and parses (EventEnvelope) from offset 0 of ``topics``."""
    consumer = replay_consumer(kafka, "niuniu-audit-bench-kafka")
    try:
        parts = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        total = sum(consumer.end_offsets(parts).values())
        parse = events_pb2.EventEnvelope.FromString
        started, read = time.perf_counter(), 0
        while read < total:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    parse(record.value)
                read += len(records)
        return read / (time.perf_counter() - started)
    finally:
        consumer.close()


def _produce_synthetic(kafka: str, topics: Topics, events: int) -> dict[str, int]:
    """Send ``events`` synthetic events; how many went to each topic."""
    producer = make_producer(kafka, "niuniu-audit-bench", linger_ms=20, batch_size=256 * 1024)
    versions: dict[str, int] = {}
    now = datetime.now(UTC)
    sent = {topics.wallet_events: 0, topics.table_events: 0}
    try:
        for position, item in enumerate(SyntheticStream(seed=1, players=50).events(events), start=1):
            version = versions.get(item.stream_id, 0) + 1
            versions[item.stream_id] = version
            envelope = build_envelope(
                event_id=str(uuid.uuid4()),
                stream_id=item.stream_id,
                version=version,
                event=item.event,
                occurred_at=now,
                producer=item.target,
                store_position=position,
            )
            topic = topics.wallet_events if item.target == "wallet" else topics.table_events
            producer.send(topic, key=item.stream_id.encode(), value=envelope.SerializeToString())
            sent[topic] += 1
        producer.flush()
    finally:
        producer.close()
    return sent


def print_bench(bench: BenchReport, cpu_per_worker: float, out: TextIO) -> None:
    """The benchmark's report: the replay's rates (in this process, or by each number of workers, held to
    ``cpu_per_worker`` of a core each), and the same run's reference rates."""
    report, entries = bench.replay, bench.entries
    rate = report.events_read / report.seconds if report.seconds else 0.0
    print(f"ledger replay benchmark, {report.events_read} events ({entries} journal entries)", file=out)
    if bench.by_workers:
        _print_workers(bench.by_workers, cpu_per_worker, out)
    else:
        _print_in_process(bench, out)
    print(
        f"  kafka_parse_per_s        {bench.kafka_parse_per_s:10.0f}   (kafka-python alone, same records, same run;"
        f" replay = {100 * rate / bench.kafka_parse_per_s if bench.kafka_parse_per_s else 0.0:.0f} %)",
        file=out,
    )
    print(f"  kafka_read               {bench.kafka_read}", file=out)
    print(f"                           replay = {bench.kafka_read.ratio(rate)} of it", file=out)
    print(f"  postgres                 {bench.postgres}", file=out)
    if bench.by_workers:
        first = _rate(bench.by_workers[0].replay)
        print(
            "scaling: "
            + ", ".join(
                f"workers={w.workers} {_rate(w.replay):.0f} events/s"
                + (f" ({_rate(w.replay) / first:.2f}x)" if i and first else "")
                for i, w in enumerate(bench.by_workers)
            ),
            file=out,
        )


def _rate(report: ReplayReport) -> float:
    return report.events_read / report.seconds if report.seconds else 0.0


def _print_in_process(bench: BenchReport, out: TextIO) -> None:
    report, entries = bench.replay, bench.entries
    rate = _rate(report)
    print(f"  replay_seconds           {report.seconds:10.2f}   (as niuniu-audit replays: no plain index)", file=out)
    print(f"  replay_events_per_s      {rate:10.0f}", file=out)
    with_indexes = report.seconds + bench.indexes_seconds
    print(
        f"  plain_indexes_seconds    {bench.indexes_seconds:10.2f}   (built afterwards, as a kept replay builds them)",
        file=out,
    )
    print(f"  with_indexes_per_s       {report.events_read / with_indexes if with_indexes else 0.0:10.0f}", file=out)
    print(f"  entries_per_s            {entries / report.seconds if report.seconds else 0.0:10.0f}", file=out)


def _print_workers(by_workers: Sequence[WorkersReport], cpu_per_worker: float, out: TextIO) -> None:
    quota = f"{cpu_per_worker:g} of a core each" if cpu_per_worker else "no CPU quota"
    for w in by_workers:
        print(
            f"  workers={w.workers} ({quota}): replay_seconds {w.replay.seconds:.2f},"
            f" replay_events_per_s {_rate(w.replay):.0f}, {w.replay.events_read} events, {w.entries} entries",
            file=out,
        )
