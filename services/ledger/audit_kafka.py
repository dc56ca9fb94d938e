"""What the audit reads of Kafka before it replays: the topics' partitions, and how far the wallet's
events have reached (the cut the wallet's balances are compared at)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from kafka import TopicPartition
from niuniu.v1 import events_pb2

from backbone.kafka import make_consumer


def partition_counts(kafka: str, topics: Sequence[str]) -> dict[str, int]:
    """How many partitions each of ``topics`` has (0: the topic does not exist yet)."""
    consumer = make_consumer(kafka, None, "niuniu-audit-partitions")
    try:
        return {topic: len(consumer.partitions_for_topic(topic) or ()) for topic in topics}
    finally:
        consumer.close()


def wallet_position_in_kafka(kafka: str, topic: str) -> int:
    """The highest wallet store position among the last record of each partition of ``topic``.

    The relay publishes in store order, so every wallet event up to that position is in Kafka.
    """
    consumer = make_consumer(kafka, None, "niuniu-audit-cut")
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        firsts = consumer.beginning_offsets(parts) if parts else {}
        ends = {tp: int(o) for tp, o in consumer.end_offsets(parts).items() if int(o) > int(firsts[tp])}
        if not ends:
            return 0
        consumer.assign(list(ends))
        for tp, offset in ends.items():
            consumer.seek(tp, offset - 1)
        highest, pending = 0, set(ends)
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                for record in records:
                    if record.offset >= ends[tp] - 1:
                        highest = max(highest, int(events_pb2.EventEnvelope.FromString(record.value).store_position))
                        pending.discard(tp)
        return highest
    finally:
        consumer.close()


def wait_for_wallet_position(kafka: str, topic: str, position: int, timeout_s: float) -> int:
    """Wait until Kafka holds the wallet's events up to ``position``; returns the highest position seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = wallet_position_in_kafka(kafka, topic)
        if seen >= position or time.monotonic() >= deadline:
            return seen
        time.sleep(0.2)
