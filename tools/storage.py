"""``python -m tools.storage``: bytes a bet, per topic and per PostgreSQL table, after a run.

  python -m tools.storage --topic-prefix P --store NAME=DSN ... [--kafka-log-dir DIR] [--bets N]

Bets: N, else the rows of the table service's ``bets`` table. Per topic: its records and their
key + value bytes (read from Kafka: what an uncompressed log holds, less Kafka's per-batch
overhead), and with ``--kafka-log-dir`` (the broker's ``log.dirs``) the bytes of its ``.log``
segment files, as compressed on disk. Per table of each store: ``pg_total_relation_size``
(rows, indexes, TOAST). Each figure also divided by the bets.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import psycopg
from kafka import TopicPartition

from backbone.config import DEFAULT_KAFKA
from backbone.kafka import make_consumer
from backbone.topics import Topics
from tools.archive import _stores


def topic_bytes(kafka: str, topic: str) -> tuple[int, int]:
    """(records, key + value bytes) of every record Kafka holds of ``topic``."""
    consumer = make_consumer(kafka, None, "niuniu-storage", max_poll_records=5_000)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not parts:
            return 0, 0
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        left = {tp for tp in parts if consumer.position(tp) < ends[tp]}
        records = size = 0
        while left:
            for tp, batch in consumer.poll(timeout_ms=500).items():
                records += len(batch)
                size += sum(len(r.key or b"") + len(r.value or b"") for r in batch)
                if consumer.position(tp) >= ends[tp]:
                    left.discard(tp)
        return records, size
    finally:
        consumer.close()


def log_bytes(log_dir: Path, topic: str) -> int:
    return sum(f.stat().st_size for f in log_dir.glob(f"{topic}-*/*.log"))


def table_sizes(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c"
            " WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace ORDER BY 2 DESC"
        ).fetchall()
    return [(str(name), int(size)) for name, size in rows]


def count_bets(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM bets").fetchone()
    return int(row[0]) if row else 0


def report(args: argparse.Namespace, out: TextIO) -> int:
    stores = _stores(args.store, os.environ)
    bets = args.bets or (count_bets(stores["table"]) if "table" in stores else 0)
    if bets <= 0:
        print("error: no bets (give --bets N, or --store table=DSN after a run)", file=sys.stderr)
        return 2
    print(f"storage: {bets} bets", file=out)
    for spec in Topics(args.topic_prefix).specs():
        records, size = topic_bytes(args.kafka, spec.name)
        disk = (
            f", on disk {log_bytes(Path(args.kafka_log_dir), spec.name) / bets:8.1f} B/bet"
            if args.kafka_log_dir
            else ""
        )
        print(f"  topic {spec.name:<40} {records:>8} records, {size / bets:8.1f} B/bet (key + value){disk}", file=out)
    for name, dsn in stores.items():
        for table, size in table_sizes(dsn):
            print(f"  table {name}.{table:<34} {size:>12} B, {size / bets:8.1f} B/bet", file=out)
    return 0


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.storage", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kafka", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", DEFAULT_KAFKA))
    parser.add_argument("--topic-prefix", default=os.environ.get("NIUNIU_TOPIC_PREFIX", ""))
    parser.add_argument("--store", action="append", default=[], help="NAME=DSN of a service's database")
    parser.add_argument("--kafka-log-dir", default="", help="the broker's log.dirs, for the bytes on disk")
    parser.add_argument("--bets", type=int, default=0, help="bets of the run (default: the table's bets rows)")
    return report(parser.parse_args(argv), out or sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
