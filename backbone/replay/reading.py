"""The replay's input: Kafka's partitions read from their start (or the archive's end) up to the end
offsets seen when the replay started, and the archive's batches, as polls decoded and staged off the
event loop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from niuniu.v1 import events_pb2

from backbone.handlers import Tracked
from backbone.kafka import make_consumer
from backbone.replay.model import Observer, Projection, ReplayGap, StagedBatch, copy_text

MAX_REPLAY_POLL_RECORDS = 5_000
# The first poll, staged while the scratch schema is made: short, as nothing is written until it is staged.
FIRST_POLL_RECORDS = 500
# Fetch sizes: a poll's records come in a few large fetches instead of many 1 MiB ones.
REPLAY_PARTITION_FETCH_BYTES = 8 * 1024 * 1024
REPLAY_FETCH_BYTES = 64 * 1024 * 1024
POLL_TIMEOUT_MS = 500


def replay_consumer(bootstrap_servers: str, client_id: str) -> KafkaConsumer:
    """A consumer with the replay's settings (no group: partitions are assigned)."""
    return make_consumer(
        bootstrap_servers,
        None,
        client_id,
        max_poll_records=MAX_REPLAY_POLL_RECORDS,
        max_partition_fetch_bytes=REPLAY_PARTITION_FETCH_BYTES,
        fetch_max_bytes=REPLAY_FETCH_BYTES,
    )


@dataclass(slots=True)
class Poll:
    polled: list[Tracked]
    tracking: bytes  # processed_events' rows of the poll (consumer, event_id, topic, partition, offset), COPY text
    staged: StagedBatch | None
    done: bool


# What opening the partitions gives: their end offsets, the partitions with records before them, the first poll.
Opened = tuple[dict[TopicPartition, int], set[TopicPartition], Poll | None]


def open_topics(
    consumer: Any,
    topics: Sequence[str],
    projection: Projection,
    observe: Observer | None = None,
    starts: Mapping[TopicPartition, int] | None = None,
) -> Opened:
    """Assign every partition of ``topics`` from its start (``starts``, else 0): their end offsets, the
    partitions with records before them, and the first poll (short) decoded and staged; None when there is none."""
    partitions = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
    return open_partitions(consumer, partitions, projection, observe, None, starts)


def open_partitions(
    consumer: Any,
    partitions: Sequence[TopicPartition],
    projection: Projection,
    observe: Observer | None = None,
    end: dict[TopicPartition, int] | None = None,
    starts: Mapping[TopicPartition, int] | None = None,
) -> Opened:
    """``open_topics`` of the given partitions (up to ``end`` when given, else their end offsets now)."""
    starts = starts or {}
    consumer.assign(list(partitions))
    firsts = consumer.beginning_offsets(list(partitions)) if partitions else {}
    for tp in partitions:
        start = starts.get(tp, 0)
        if int(firsts[tp]) > start:
            raise ReplayGap(
                f"Kafka no longer holds {tp.topic}[{tp.partition}] offsets {start}..{int(firsts[tp]) - 1}:"
                " replay with the archive that holds them"
            )
        consumer.seek(tp, start)
    end = dict(consumer.end_offsets(list(partitions)) if end is None else end)
    remaining = {tp for tp, offset in end.items() if offset > starts.get(tp, 0)}
    first = poll_and_stage(consumer, projection, end, remaining, FIRST_POLL_RECORDS, observe) if remaining else None
    return end, remaining, first


def poll_and_stage(
    consumer: Any,
    projection: Projection,
    end: dict[TopicPartition, int],
    remaining: set[TopicPartition],
    max_records: int | None = None,
    observe: Observer | None = None,
) -> Poll:
    """One poll of up to ``max_records`` (else ``MAX_REPLAY_POLL_RECORDS``), decoded, shown to ``observe`` and
    staged (runs on a worker thread; ``remaining`` is updated)."""
    limit = MAX_REPLAY_POLL_RECORDS if max_records is None else max_records
    batches = consumer.poll(POLL_TIMEOUT_MS, max_records=limit)
    polled: list[Tracked] = []
    rows: list[str] = []
    name = copy_text(projection.name)
    parse = events_pb2.EventEnvelope.FromString
    for tp, records in batches.items():
        last = end[tp]
        topic, partition = tp.topic, tp.partition
        where = f"{copy_text(topic)}\t{partition}"
        for record in records:
            offset = record.offset
            if offset >= last:
                remaining.discard(tp)
                break
            envelope = parse(record.value)
            rows.append(f"{name}\t{copy_text(envelope.event_id)}\t{where}\t{offset}\n")
            polled.append(Tracked(envelope, topic, partition, offset))
            if offset + 1 >= last:
                remaining.discard(tp)
    for tp in list(remaining):
        if consumer.position(tp) >= end[tp]:
            remaining.discard(tp)
    if observe is not None and polled:
        observe(polled)
    staged = projection.stager(polled) if polled and projection.stager is not None else None
    return Poll(polled, "".join(rows).encode(), staged, not remaining)


def archived_poll(projection: Projection, batch: Sequence[Tracked], observe: Observer | None) -> Poll:
    """An archived batch as a poll: shown to ``observe``, its tracking rows, staged (on a worker thread)."""
    polled = list(batch)
    if observe is not None and polled:
        observe(polled)
    name = copy_text(projection.name)
    rows = "".join(
        f"{name}\t{copy_text(t.envelope.event_id)}\t{copy_text(t.topic)}\t{t.partition}\t{t.offset}\n" for t in polled
    )
    staged = projection.stager(polled) if polled and projection.stager is not None else None
    return Poll(polled, rows.encode(), staged, False)


def end_offsets(consumer: Any, topics: Sequence[str]) -> dict[TopicPartition, int]:
    partitions = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
    return dict(consumer.end_offsets(partitions))


def observe_all(
    consumer: Any,
    reader: Projection,
    end: dict[TopicPartition, int],
    observe: Observer,
    starts: Mapping[TopicPartition, int] | None = None,
) -> None:
    """Show ``observe`` every record of ``end``'s partitions from ``starts``, a poll at a time
    (``reader``: no stager)."""
    _, remaining, poll = open_partitions(consumer, list(end), reader, observe, end, starts)
    while poll is not None and not poll.done:
        poll = poll_and_stage(consumer, reader, end, remaining, MAX_REPLAY_POLL_RECORDS, observe)
