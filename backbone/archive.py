"""Sealed archive segments: the topics' records past the hot tier, as files an auditor can check.

An archive is a directory: ``manifest.json`` and the segments ``segment-NNNNNN.jsonl.zst``,
each a zstd-compressed file of JSON lines. Its first line is the header; every other line is
one Kafka record (topic, partition, offset, key, value), in partition order. The header names
the segment's number, the SHA-256 of the segment before it (a chain: ``GENESIS`` for the first)
and, per partition, the offsets it holds: from the previous segment's end (0 for the first) to
the end offset Kafka had when the segment was cut. The manifest lists each segment's file and
SHA-256; ``verify`` recomputes them, so a segment changed by one byte (its hash), a missing one
(its file, or the next one's header naming a hash no segment has) or one taken out of the middle
(the numbers, the chain and the offsets no longer follow) is found. The last segment's hash (the
head, printed when a segment is written) is what an auditor keeps apart from the archive: with
``expect_head``, dropping the newest segments is found too.

What a segment tells the pruning (``backbone.prune``), per producing service and per partition:

* ``archived_below``: the service's event store position below which every event is archived.
  Read before the end offsets, as the smallest unpublished outbox position (or one past the
  store's last) with no append in flight: the relay had Kafka acknowledge every copy of those
  events before it marked them published, so every copy lies below the end offsets cut next.
* per partition ``safe``: the offset below which no record's event can be sent again (its
  producer's position is below ``archived_below``), and ``last_copy``: the last record that
  repeats an earlier record's event (a relay's resend after a crash; -1 when none). Every copy of
  an event below ``safe`` lies below ``end``, so a consumer whose stored position is past
  ``last_copy`` has read them all: its tracking rows below ``safe`` are needed no more.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import zstandard
from kafka import TopicPartition
from niuniu.v1 import events_pb2

from backbone.eventstore import wait_for_appends
from backbone.handlers import Tracked
from backbone.kafka import make_consumer

FORMAT = "niuniu-archive/1"
GENESIS = "0" * 64
MANIFEST = "manifest.json"
ZSTD_LEVEL = 10
POLL_MS = 500
READ_BATCH = 5_000
# Table events that end a round: its events may leave the hot tier once archived.
ROUND_ENDS = frozenset({"table.round_settled", "table.round_voided"})


class ArchiveError(Exception):
    """The archive cannot be written or read as asked (a broken chain, Kafka past the archive)."""


@dataclass(frozen=True, slots=True)
class PartitionRange:
    topic: str
    partition: int
    start: int
    end: int
    safe: int
    # The offset of the partition's last record repeating an earlier one's event (-1: none).
    last_copy: int = -1


@dataclass(frozen=True, slots=True)
class Header:
    number: int
    previous_sha256: str
    created_at: str
    partitions: tuple[PartitionRange, ...]
    archived_below: Mapping[str, int]
    closed_rounds: tuple[str, ...]
    records: int

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "number": self.number,
            "previous_sha256": self.previous_sha256,
            "created_at": self.created_at,
            "partitions": [
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "start": p.start,
                    "end": p.end,
                    "safe": p.safe,
                    "last_copy": p.last_copy,
                }
                for p in self.partitions
            ],
            "archived_below": dict(self.archived_below),
            "closed_rounds": list(self.closed_rounds),
            "records": self.records,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Header:
        if data.get("format") != FORMAT:
            raise ArchiveError(f"not a segment of {FORMAT}: {data.get('format')!r}")
        return cls(
            int(data["number"]),
            str(data["previous_sha256"]),
            str(data["created_at"]),
            tuple(PartitionRange(**p) for p in data["partitions"]),
            {str(k): int(v) for k, v in data["archived_below"].items()},
            tuple(str(r) for r in data["closed_rounds"]),
            int(data["records"]),
        )

    def ends(self) -> dict[tuple[str, int], int]:
        return {(p.topic, p.partition): p.end for p in self.partitions}


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    number: int
    file: str
    sha256: str
    records: int
    bytes: int


@dataclass
class Verified:
    """An archive as checked: its segments' headers in order, and what is wrong with it."""

    headers: list[Header] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    head: str = GENESIS
    size_bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(archive: Path) -> list[SegmentEntry]:
    path = archive / MANIFEST
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return [SegmentEntry(**s) for s in data["segments"]]


def _write_manifest(archive: Path, segments: Sequence[SegmentEntry]) -> None:
    data = {
        "format": FORMAT,
        "head_sha256": segments[-1].sha256 if segments else GENESIS,
        "segments": [
            {"number": s.number, "file": s.file, "sha256": s.sha256, "records": s.records, "bytes": s.bytes}
            for s in segments
        ],
    }
    tmp = archive / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, archive / MANIFEST)


def _lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as reader:
        yield from io.BufferedReader(reader)


def read_header(path: Path) -> Header:
    for line in _lines(path):
        return Header.from_json(json.loads(line))
    raise ArchiveError(f"{path.name} is empty")


def verify(archive: Path, expect_head: str = "") -> Verified:
    """Check every segment's hash, the chain and the offsets' continuity (``Verified.problems``)."""
    result = Verified()
    entries = read_manifest(archive)
    previous: Header | None = None
    for n, entry in enumerate(entries, start=1):
        path = archive / entry.file
        if entry.number != n:
            result.problems.append(f"segment {n} missing from the manifest (found segment {entry.number} in its place)")
        if not path.exists():
            result.problems.append(f"segment {entry.number} missing: {entry.file} is not in the archive")
            result.head = entry.sha256
            previous = None
            continue
        actual = sha256_of(path)
        result.size_bytes += path.stat().st_size
        if actual != entry.sha256:
            result.problems.append(
                f"segment {entry.number} altered: {entry.file} has sha256 {actual}, the manifest says {entry.sha256}"
            )
        try:
            header = read_header(path)
        except (ArchiveError, ValueError, KeyError, zstandard.ZstdError) as error:
            result.problems.append(f"segment {entry.number} unreadable: {error}")
            result.head = entry.sha256
            previous = None
            continue
        if header.previous_sha256 != result.head:
            result.problems.append(
                f"chain broken at segment {entry.number}: it names {header.previous_sha256} before it,"
                f" the archive has {result.head}"
            )
        result.problems.extend(_gaps(entry.number, previous, header))
        result.headers.append(header)
        result.head, previous = entry.sha256, header
    if expect_head and expect_head != result.head:
        result.problems.append(f"the archive's head is {result.head}, not {expect_head}: segments are missing")
    return result


def _gaps(number: int, previous: Header | None, header: Header) -> list[str]:
    """Offsets a segment should continue from (its predecessor's ends, or 0) but does not."""
    before = previous.ends() if previous is not None else {}
    return [
        f"segment {number} starts {p.topic}[{p.partition}] at offset {p.start}, after"
        f" {before.get((p.topic, p.partition), 0)}"
        for p in header.partitions
        if previous is not None and p.start != before.get((p.topic, p.partition), 0)
    ]


def archived_ends(headers: Sequence[Header]) -> dict[tuple[str, int], int]:
    """Per partition, the offset the archive holds records up to (exclusive)."""
    ends: dict[tuple[str, int], int] = {}
    for header in headers:
        ends.update(header.ends())
    return ends


def archived_records(archive: Path, topics: Sequence[str], headers: Sequence[Header]) -> Iterator[list[Tracked]]:
    """The archive's records of ``topics`` as a replay reads them, in batches (in partition order)."""
    wanted = set(topics)
    batch: list[Tracked] = []
    for entry in read_manifest(archive)[: len(headers)]:
        lines = _lines(archive / entry.file)
        next(lines)  # the header
        for line in lines:
            record = json.loads(line)
            if record["t"] not in wanted:
                continue
            envelope = events_pb2.EventEnvelope.FromString(base64.b64decode(record["v"]))
            batch.append(Tracked(envelope, record["t"], int(record["p"]), int(record["o"])))
            if len(batch) >= READ_BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


# --- writing ---------------------------------------------------------------------------------------------


async def archived_below(dsn: str) -> int:
    """The store position below which every event of this store is published (no append in flight)."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        await wait_for_appends(conn)
        cur = await conn.execute(
            "SELECT coalesce((SELECT min(position) FROM outbox WHERE published_at IS NULL),"
            " (SELECT max(position) + 1 FROM events), 1)"
        )
        row = await cur.fetchone()
    return int(row[0]) if row else 1


@dataclass
class _Cut:
    """A segment being read from Kafka."""

    below: Mapping[str, int]
    records: list[bytes] = field(default_factory=list)
    safe: dict[TopicPartition, int] = field(default_factory=dict)
    closed: set[str] = field(default_factory=set)
    seen: dict[TopicPartition, set[str]] = field(default_factory=dict)
    last_copy: dict[TopicPartition, int] = field(default_factory=dict)

    def check(self, tp: TopicPartition, offset: int, envelope: events_pb2.EventEnvelope) -> None:
        """Note the first record of the partition whose event its producer may still send again, and
        the last record repeating an event read before (a relay's resend)."""
        if envelope.store_position >= self.below.get(envelope.producer, 0) and tp not in self.safe:
            self.safe[tp] = offset  # the consumers keep its tracking row, and those after it
        seen = self.seen.setdefault(tp, set())
        if envelope.event_id in seen:
            self.last_copy[tp] = offset
        seen.add(envelope.event_id)

    def add(self, tp: TopicPartition, offset: int, key: bytes | None, value: bytes) -> None:
        envelope = events_pb2.EventEnvelope.FromString(value)
        self.check(tp, offset, envelope)
        if envelope.event_type in ROUND_ENDS and envelope.correlation_id:
            self.closed.add(envelope.correlation_id)
        self.records.append(
            json.dumps(
                {
                    "t": tp.topic,
                    "p": tp.partition,
                    "o": offset,
                    "k": (key or b"").decode(),
                    "v": base64.b64encode(value).decode(),
                },
                separators=(",", ":"),
            ).encode()
        )


def read_cut(
    kafka: str,
    topics: Sequence[str],
    starts: Mapping[tuple[str, int], int],
    rechecks: Mapping[tuple[str, int], int],
    below: Mapping[str, int],
) -> tuple[_Cut, dict[TopicPartition, tuple[int, int]]]:
    """Every record of ``topics`` from ``starts`` (0 where absent) to the end offsets now, in partition order.

    The records from ``rechecks`` (the last segment's ``safe``) up to ``starts`` are archived already and
    only read again for ``safe``: their events may have been published since."""
    consumer = make_consumer(kafka, None, "niuniu-archive", max_poll_records=READ_BATCH)
    try:
        parts = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        ends = {tp: int(o) for tp, o in consumer.end_offsets(parts).items()}
        firsts = {tp: int(o) for tp, o in consumer.beginning_offsets(parts).items()}
        ranges = {tp: (starts.get((tp.topic, tp.partition), 0), ends[tp]) for tp in parts}
        cut = _Cut(below)
        for tp in parts:
            start, end = ranges[tp]
            first = min(start, rechecks.get((tp.topic, tp.partition), start))
            if firsts[tp] > first:
                raise ArchiveError(
                    f"Kafka no longer holds {tp.topic}[{tp.partition}] offsets {first}..{firsts[tp] - 1}:"
                    " they were deleted before being archived, or their events were never marked published"
                )
            if first < end:
                _read_partition(consumer, tp, first, start, end, cut)
        return cut, ranges
    finally:
        consumer.close()


def _read_partition(consumer: Any, tp: TopicPartition, first: int, start: int, end: int, cut: _Cut) -> None:
    """Records ``first``..``end`` of ``tp``: those from ``start`` on into the segment, the others checked."""
    consumer.assign([tp])
    consumer.seek(tp, first)
    position = first
    while position < end:
        for records in consumer.poll(timeout_ms=POLL_MS).values():
            for record in records:
                if record.offset >= end:
                    return
                if record.offset >= start:
                    cut.add(tp, record.offset, record.key, record.value)
                else:
                    cut.check(tp, record.offset, events_pb2.EventEnvelope.FromString(record.value))
                position = record.offset + 1


def write_segment(archive: Path, header: Header, records: Sequence[bytes]) -> SegmentEntry:
    """Seal ``records`` under ``header`` as the next segment, then list it in the manifest."""
    name = f"segment-{header.number:06d}.jsonl.zst"
    body = b"\n".join([json.dumps(header.as_json(), separators=(",", ":")).encode(), *records]) + b"\n"
    data = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(body)
    tmp = archive / (name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, archive / name)
    entry = SegmentEntry(header.number, name, hashlib.sha256(data).hexdigest(), header.records, len(data))
    _write_manifest(archive, [*read_manifest(archive), entry])
    return entry


async def archive_next(
    archive: Path, kafka: str, topics: Sequence[str], stores: Mapping[str, str]
) -> tuple[SegmentEntry | None, Verified]:
    """Write the next segment: the records of ``topics`` since the last one (None: nothing new).

    ``stores``: each producing service's name and the DSN of its event store (``archived_below``).
    """
    archive.mkdir(parents=True, exist_ok=True)
    checked = verify(archive)
    if not checked.ok:
        raise ArchiveError("the archive does not verify: " + "; ".join(checked.problems))
    below = {name: await archived_below(dsn) for name, dsn in stores.items()}
    last = checked.headers[-1] if checked.headers else None
    rechecks = {(p.topic, p.partition): p.safe for p in last.partitions} if last is not None else {}
    cut, ranges = await asyncio.to_thread(read_cut, kafka, topics, archived_ends(checked.headers), rechecks, below)
    if not cut.records:
        return None, checked
    partitions = tuple(
        PartitionRange(tp.topic, tp.partition, start, end, cut.safe.get(tp, end), cut.last_copy.get(tp, -1))
        for tp, (start, end) in ranges.items()
    )
    header = Header(
        len(checked.headers) + 1,
        checked.head,
        datetime.now(UTC).isoformat(timespec="seconds"),
        partitions,
        below,
        tuple(sorted(cut.closed)),
        len(cut.records),
    )
    return write_segment(archive, header, cut.records), checked
