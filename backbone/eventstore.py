"""An append-only event store in PostgreSQL with a transactional outbox.

``append`` writes events and their outbox rows in the caller's transaction, so a
state change and the events announcing it commit or vanish together. The
schema enforces optimistic concurrency: ``(stream_id, version)`` is unique, and
an append that loses the race raises ``ConcurrencyError``.

Positions (``events.position``) are handed out under a transaction-scoped
advisory lock, so they become visible in commit order and a reader following
``read_all`` never skips an event that commits late with a smaller number.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
from google.protobuf import any_pb2, timestamp_pb2
from google.protobuf.message import Message
from niuniu.v1 import events_pb2

from backbone.db import run_ddl

SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS events (
        position        BIGINT PRIMARY KEY,
        event_id        UUID NOT NULL UNIQUE,
        stream_id       TEXT NOT NULL,
        version         BIGINT NOT NULL CHECK (version > 0),
        event_type      TEXT NOT NULL,
        correlation_id  TEXT NOT NULL,
        occurred_at     TIMESTAMPTZ NOT NULL,
        envelope        BYTEA NOT NULL,
        UNIQUE (stream_id, version)
    )
    """,
    "CREATE SEQUENCE IF NOT EXISTS events_position_seq",
    "CREATE INDEX IF NOT EXISTS events_correlation_idx ON events (correlation_id)",
    """
    CREATE TABLE IF NOT EXISTS outbox (
        position      BIGINT PRIMARY KEY REFERENCES events (position),
        topic         TEXT NOT NULL,
        record_key    TEXT NOT NULL,
        published_at  TIMESTAMPTZ
    )
    """,
    "CREATE INDEX IF NOT EXISTS outbox_unpublished_idx ON outbox (position) WHERE published_at IS NULL",
)

_APPEND_LOCK = "SELECT pg_advisory_xact_lock(hashtext('niuniu.events.append'))"


class ConcurrencyError(Exception):
    """Another writer appended to the stream first: reload and decide again."""

    def __init__(self, stream_id: str, expected_version: int) -> None:
        super().__init__(f"stream {stream_id!r} is no longer at version {expected_version}")
        self.stream_id = stream_id
        self.expected_version = expected_version


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append. ``topic`` overrides the store's default topic (e.g. the audit topic)."""

    event_type: str
    payload: Message
    correlation_id: str = ""
    causation_id: str = ""
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class StoredEvent:
    position: int
    envelope: events_pb2.EventEnvelope

    @property
    def stream_id(self) -> str:
        return self.envelope.stream_id

    @property
    def version(self) -> int:
        return self.envelope.stream_version

    @property
    def event_type(self) -> str:
        return self.envelope.event_type

    def unpack(self, message: Message) -> Message:
        if not self.envelope.payload.Unpack(message):
            raise TypeError(
                f"{self.event_type} payload is {self.envelope.payload.type_url}, not {message.DESCRIPTOR.full_name}"
            )
        return message


def utc_now() -> datetime:
    return datetime.now(UTC)


class EventStore:
    """One service's event store. Time and ids are injectable for deterministic tests."""

    def __init__(
        self,
        producer: str,
        default_topic: str,
        *,
        clock: Callable[[], datetime] = utc_now,
        new_id: Callable[[], uuid.UUID] = uuid.uuid4,
    ) -> None:
        self.producer = producer
        self.default_topic = default_topic
        self._clock = clock
        self._new_id = new_id

    async def setup(self, conn: psycopg.AsyncConnection) -> None:
        await run_ddl(conn, SCHEMA)

    async def append(
        self,
        conn: psycopg.AsyncConnection,
        stream_id: str,
        expected_version: int,
        events: Sequence[NewEvent],
    ) -> list[StoredEvent]:
        """Append ``events`` after ``expected_version`` (0 for a new stream), inside the caller's transaction.

        Raises ``ConcurrencyError`` when the stream is not at ``expected_version``; the
        check runs under the append lock, before anything is written, so the caller's
        transaction stays usable.
        """
        if not events:
            return []
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
            async with conn.transaction():
                return await self.append(conn, stream_id, expected_version, events)
        cur = await conn.execute(
            _APPEND_LOCK + ", (SELECT coalesce(max(version), 0) FROM events WHERE stream_id = %s),"
            " array(SELECT nextval('events_position_seq') FROM generate_series(1, %s))",
            (stream_id, len(events)),
        )
        row = await cur.fetchone()
        if row is None or row[1] != expected_version:
            raise ConcurrencyError(stream_id, expected_version)
        positions = [int(p) for p in row[2]]
        stored = [
            StoredEvent(position, self._envelope(stream_id, expected_version + i, event, position))
            for i, (position, event) in enumerate(zip(positions, events, strict=True), start=1)
        ]
        await self._insert(conn, stored, events)
        return stored

    def _envelope(self, stream_id: str, version: int, event: NewEvent, position: int) -> events_pb2.EventEnvelope:
        return build_envelope(
            event_id=str(self._new_id()),
            stream_id=stream_id,
            version=version,
            event=event,
            occurred_at=self._clock(),
            producer=self.producer,
            store_position=position,
        )

    async def _insert(
        self, conn: psycopg.AsyncConnection, stored: list[StoredEvent], events: Sequence[NewEvent]
    ) -> None:
        rows = [
            (
                e.position,
                e.envelope.event_id,
                e.stream_id,
                e.version,
                e.event_type,
                e.envelope.correlation_id,
                e.envelope.occurred_at.ToDatetime(tzinfo=UTC),
                e.envelope.SerializeToString(),
            )
            for e in stored
        ]
        async with conn.cursor() as cur:
            try:
                await cur.executemany(
                    "INSERT INTO events (position, event_id, stream_id, version, event_type, correlation_id,"
                    " occurred_at, envelope) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    rows,
                )
            except psycopg.errors.UniqueViolation:
                raise ConcurrencyError(stored[0].stream_id, stored[0].version - 1) from None
            await cur.executemany(
                "INSERT INTO outbox (position, topic, record_key) VALUES (%s, %s, %s)",
                [
                    (e.position, event.topic or self.default_topic, e.stream_id)
                    for e, event in zip(stored, events, strict=True)
                ],
            )

    async def read_stream(
        self, conn: psycopg.AsyncConnection, stream_id: str, after_version: int = 0
    ) -> list[StoredEvent]:
        cur = await conn.execute(
            "SELECT position, envelope FROM events WHERE stream_id = %s AND version > %s ORDER BY version",
            (stream_id, after_version),
        )
        return [_stored(row) for row in await cur.fetchall()]

    async def read_all(
        self, conn: psycopg.AsyncConnection, after_position: int = 0, limit: int = 1000
    ) -> list[StoredEvent]:
        cur = await conn.execute(
            "SELECT position, envelope FROM events WHERE position > %s ORDER BY position LIMIT %s",
            (after_position, limit),
        )
        return [_stored(row) for row in await cur.fetchall()]

    async def read_correlated(self, conn: psycopg.AsyncConnection, correlation_id: str) -> list[StoredEvent]:
        cur = await conn.execute(
            "SELECT position, envelope FROM events WHERE correlation_id = %s ORDER BY position", (correlation_id,)
        )
        return [_stored(row) for row in await cur.fetchall()]

    async def stream_version(self, conn: psycopg.AsyncConnection, stream_id: str) -> int:
        cur = await conn.execute("SELECT coalesce(max(version), 0) FROM events WHERE stream_id = %s", (stream_id,))
        row = await cur.fetchone()
        return int(row[0]) if row else 0


def build_envelope(
    *,
    event_id: str,
    stream_id: str,
    version: int,
    event: NewEvent,
    occurred_at: datetime,
    producer: str,
    store_position: int,
) -> events_pb2.EventEnvelope:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(occurred_at)
    payload = any_pb2.Any()
    payload.Pack(event.payload)
    return events_pb2.EventEnvelope(
        event_id=event_id,
        stream_id=stream_id,
        stream_version=version,
        event_type=event.event_type,
        occurred_at=ts,
        correlation_id=event.correlation_id,
        causation_id=event.causation_id,
        producer=producer,
        store_position=store_position,
        payload=payload,
    )


def _stored(row: tuple[int, bytes]) -> StoredEvent:
    envelope = events_pb2.EventEnvelope()
    envelope.ParseFromString(row[1])
    return StoredEvent(int(row[0]), envelope)


def stored_event(row: tuple[int, bytes]) -> StoredEvent:
    """A (position, envelope bytes) row of ``events`` as a StoredEvent (for services' own queries)."""
    return _stored(row)
