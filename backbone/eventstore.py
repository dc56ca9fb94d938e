"""An append-only event store in PostgreSQL with a transactional outbox.

``append`` writes events and their outbox rows in the caller's transaction, so a
state change and the events announcing it commit or vanish together. The
schema enforces optimistic concurrency: ``(stream_id, version)`` is unique, and
an append that loses the race raises ``ConcurrencyError``.

Ordering without a global lock held to commit. Positions (``events.position``)
come from a sequence, so appenders in different transactions do not wait for each
other. What readers need from positions is kept by two transaction-scoped advisory
locks, taken in the append's one round trip (``niuniu_append_events``):

* a lock per *ordering domain*, the stream id up to its first ``.`` (``table-7``
  for ``table-7`` and ``table-7.bet-42``), exclusive: appends within one domain
  commit in position order, so a reader following one domain by position (a
  table's watchers) never skips an event that commits late with a smaller
  number. Different domains (tables, accounts) append side by side.
* one store-wide lock, *shared* by every append: it costs appenders nothing
  against each other. A reader that needs the whole store as a prefix of
  positions (``read_all``, a balance snapshot "as of position P") takes it
  exclusively with ``wait_for_appends``: once granted, no append is in flight,
  so every event up to the largest visible position is visible.

Event envelopes are stored without ``store_position`` (it is the row's column);
readers and the relay set it from the column.

An event's payload is at most ``MAX_PAYLOAD_BYTES``: a larger one raises ``EventTooLarge``
before anything is written, because the relay could never send it (``backbone.kafka.MAX_RECORD_BYTES``)
and it would stop the relay, and every event behind it, at the head of the outbox.
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

from backbone import tracing
from backbone.db import run_ddl
from backbone.keyhash import key_hash

TRACE_CONTEXT_DEFAULT = "nullif(current_setting('niuniu.trace_context', true), '')"
SET_TRACE_CONTEXT = "SELECT set_config('niuniu.trace_context', %s, true)"

SCHEMA: tuple[str, ...] = (
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
        published_at  TIMESTAMPTZ,
        key_hash      INT CHECK (key_hash >= 0),
        -- The trace of the command that appended the event (backbone/tracing.py): the transaction's
        -- niuniu.trace_context setting, set only while tracing is on; the relay sends it as a header.
        trace_context TEXT DEFAULT nullif(current_setting('niuniu.trace_context', true), '')
    )
    """,
    "CREATE INDEX IF NOT EXISTS outbox_unpublished_idx ON outbox (position) WHERE published_at IS NULL",
)

# The store-wide lock: shared by appends, exclusive for readers that need a prefix of positions.
STORE_LOCK_KEY = "niuniu.events.append"
# The class id of the per-domain locks (two-int advisory keys: class, hashtext(domain)).
DOMAIN_LOCK_CLASS = 0x6E6E

APPEND_FUNCTION = f"""
CREATE OR REPLACE FUNCTION niuniu_append_events(
    p_stream TEXT, p_domain TEXT, p_expected BIGINT, p_ids UUID[], p_types TEXT[], p_correlations TEXT[],
    p_occurred TIMESTAMPTZ[], p_envelopes BYTEA[], p_topics TEXT[], p_key_hash INT
) RETURNS BIGINT[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    current_version BIGINT;
    positions BIGINT[];
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('{STORE_LOCK_KEY}'));
    PERFORM pg_advisory_xact_lock({DOMAIN_LOCK_CLASS}, hashtext(p_domain));
    -- A new snapshot (READ COMMITTED): every append of this domain before ours has committed.
    SELECT coalesce(max(version), 0) INTO current_version FROM events WHERE stream_id = p_stream;
    IF current_version <> p_expected THEN
        RETURN NULL;
    END IF;
    WITH new_events AS (
        INSERT INTO events (position, event_id, stream_id, version, event_type, correlation_id, occurred_at, envelope)
        SELECT nextval('events_position_seq'), e.id, p_stream, p_expected + e.n, e.t, e.c, e.o, e.env
        FROM unnest(p_ids, p_types, p_correlations, p_occurred, p_envelopes) WITH ORDINALITY AS e (id, t, c, o, env, n)
        RETURNING position, version
    ), new_outbox AS (
        INSERT INTO outbox (position, topic, record_key, key_hash)
        SELECT position, p_topics[version - p_expected], p_stream, p_key_hash FROM new_events
    )
    SELECT array_agg(position ORDER BY version) INTO positions FROM new_events;
    RETURN positions;
END
$$
"""

# The same append for callers that do not read its result before they commit (pipeline mode, or the
# call inside a larger statement): a stream not at ``p_expected`` raises serialization_failure (40001),
# so the caller's transaction aborts instead of committing its other writes without the events.
STRICT_APPEND_FUNCTION = """
CREATE OR REPLACE FUNCTION niuniu_append_events_strict(
    p_stream TEXT, p_domain TEXT, p_expected BIGINT, p_ids UUID[], p_types TEXT[], p_correlations TEXT[],
    p_occurred TIMESTAMPTZ[], p_envelopes BYTEA[], p_topics TEXT[], p_key_hash INT
) RETURNS BIGINT[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    positions BIGINT[];
BEGIN
    positions := niuniu_append_events(p_stream, p_domain, p_expected, p_ids, p_types, p_correlations, p_occurred,
                                      p_envelopes, p_topics, p_key_hash);
    IF positions IS NULL THEN
        RAISE EXCEPTION 'stream % is no longer at version %', p_stream, p_expected USING ERRCODE = '40001';
    END IF;
    RETURN positions;
END
$$
"""

# The one-event append (most appends: a bet, a hold): the same locks and check as
# ``niuniu_append_events`` with scalar arguments and plain INSERTs, which costs PostgreSQL
# about half of the array form (no unnest, no array parsing of the parameters).
APPEND_ONE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION niuniu_append_event(
    p_stream TEXT, p_domain TEXT, p_expected BIGINT, p_id UUID, p_type TEXT, p_correlation TEXT,
    p_occurred TIMESTAMPTZ, p_envelope BYTEA, p_topic TEXT, p_key_hash INT
) RETURNS BIGINT LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    new_position BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('{STORE_LOCK_KEY}'));
    PERFORM pg_advisory_xact_lock({DOMAIN_LOCK_CLASS}, hashtext(p_domain));
    -- A new snapshot (READ COMMITTED): every append of this domain before ours has committed.
    IF coalesce((SELECT max(version) FROM events WHERE stream_id = p_stream), 0) <> p_expected THEN
        RETURN NULL;
    END IF;
    INSERT INTO events (position, event_id, stream_id, version, event_type, correlation_id, occurred_at, envelope)
    VALUES (nextval('events_position_seq'), p_id, p_stream, p_expected + 1, p_type, p_correlation, p_occurred,
            p_envelope)
    RETURNING position INTO new_position;
    INSERT INTO outbox (position, topic, record_key, key_hash) VALUES (new_position, p_topic, p_stream, p_key_hash);
    RETURN new_position;
END
$$
"""

STRICT_APPEND_ONE_FUNCTION = """
CREATE OR REPLACE FUNCTION niuniu_append_event_strict(
    p_stream TEXT, p_domain TEXT, p_expected BIGINT, p_id UUID, p_type TEXT, p_correlation TEXT,
    p_occurred TIMESTAMPTZ, p_envelope BYTEA, p_topic TEXT, p_key_hash INT
) RETURNS BIGINT[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    new_position BIGINT;
BEGIN
    new_position := niuniu_append_event(p_stream, p_domain, p_expected, p_id, p_type, p_correlation, p_occurred,
                                        p_envelope, p_topic, p_key_hash);
    IF new_position IS NULL THEN
        RAISE EXCEPTION 'stream % is no longer at version %', p_stream, p_expected USING ERRCODE = '40001';
    END IF;
    RETURN ARRAY[new_position];
END
$$
"""

SCHEMA = (
    *SCHEMA,
    APPEND_FUNCTION,
    STRICT_APPEND_FUNCTION,
    APPEND_ONE_FUNCTION,
    STRICT_APPEND_ONE_FUNCTION,
)

_APPEND_ARGS = (
    "%({p}stream)s, %({p}domain)s, %({p}expected)s, %({p}ids)b::uuid[], %({p}types)b::text[],"
    " %({p}correlations)b::text[], %({p}occurred)b::timestamptz[], %({p}envelopes)b::bytea[], %({p}topics)b::text[],"
    " %({p}key_hash)s::int"
)

_APPEND_MANY = (
    "SELECT niuniu_append_events(%s, %s, %s, %b::uuid[], %b::text[], %b::text[], %b::timestamptz[],"
    " %b::bytea[], %b::text[], %s::int)"
)
_APPEND_ONE = "SELECT niuniu_append_event(%s, %s, %s, %s::uuid, %s, %s, %s, %s, %s, %s::int)"
_APPEND_ONE_ARGS = (
    "%({p}stream)s, %({p}domain)s, %({p}expected)s, %({p}id)s::uuid, %({p}type)s, %({p}correlation)s,"
    " %({p}occurred)s, %({p}envelope)s, %({p}topic)s, %({p}key_hash)s::int"
)

_WAIT_FOR_APPENDS = f"SELECT pg_advisory_xact_lock(hashtext('{STORE_LOCK_KEY}'))"
# An append's two locks, in the append's order (``niuniu_append_event``): the store's shared, then the
# ordering domain's (the named parameter ``domain``: ``ordering_domain`` of the stream). As select-list
# items, for a caller that takes them ahead of its appends in the same READ COMMITTED transaction (the
# appends take them again; they are held to commit): a statement after that one sees everything the
# domain's earlier appenders committed, which the appending statement alone would not (its snapshot is
# taken before it waits for the lock). For a check of committed rows that must still hold at the append.
ORDER_AFTER_LOCKS = (
    f"pg_advisory_xact_lock_shared(hashtext('{STORE_LOCK_KEY}')),"
    f" pg_advisory_xact_lock({DOMAIN_LOCK_CLASS}, hashtext(%(domain)s))"
)
# The largest payload an event may carry: the bus's record limit (``backbone.kafka.MAX_RECORD_BYTES``,
# 4 MiB; not imported: the gateway imports the store's errors, not Kafka) less 64 KiB for the envelope's
# other fields, the record's key and Kafka's overhead (``tests/table/test_round_size.py`` holds the two).
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024 - 64 * 1024
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TYPE_URL_PREFIX = "type.googleapis.com/"  # as Any.Pack names a payload's type
_STORE_POSITION_TAG = b"\x48"  # EventEnvelope.store_position: field 9, varint


def ordering_domain(stream_id: str) -> str:
    """The streams whose appends commit in position order: the stream id up to its first '.'."""
    return stream_id.split(".", 1)[0]


def with_store_position(envelope: bytes, position: int) -> bytes:
    """The serialized envelope with ``store_position`` set (a later field wins when parsing)."""
    out = bytearray(_STORE_POSITION_TAG)
    value = position
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return envelope + bytes(out)


async def note_trace(conn: psycopg.AsyncConnection) -> None:
    """With tracing on, the current trace becomes that of the outbox rows this transaction appends next."""
    traceparent = tracing.current_traceparent()
    if traceparent is not None:
        await conn.execute(SET_TRACE_CONTEXT, (traceparent,))


async def wait_for_appends(conn: psycopg.AsyncConnection) -> None:
    """In the caller's READ COMMITTED transaction: wait until no append is in flight, and keep it so.

    Until the transaction ends no append starts, so a statement run after this sees a
    prefix of positions: every event up to the largest visible position. For rare
    readers (an audit snapshot), never for a hot path.
    """
    await conn.execute(_WAIT_FOR_APPENDS)


class EventTooLarge(ValueError):
    """An event whose payload is over ``MAX_PAYLOAD_BYTES``: the bus could not carry it, so it is not written."""

    def __init__(self, event_type: str, size: int) -> None:
        super().__init__(f"{event_type} payload of {size} bytes is over the {MAX_PAYLOAD_BYTES} an event may carry")
        self.event_type = event_type
        self.size = size


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

        One round trip. Raises ``ConcurrencyError`` when the stream is not at
        ``expected_version``; the check runs under the ordering domain's lock, before
        anything is written, so the caller's transaction stays usable.
        """
        if not events:
            return []
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
            async with conn.transaction():
                return await self.append(conn, stream_id, expected_version, events)
        await note_trace(conn)
        statement, params, envelopes = self._append_statement(stream_id, expected_version, events)
        try:
            cur = await conn.execute(statement, params)
        except psycopg.errors.UniqueViolation:
            raise ConcurrencyError(stream_id, expected_version) from None
        row = await cur.fetchone()
        if row is None or row[0] is None:
            raise ConcurrencyError(stream_id, expected_version)
        positions = row[0] if isinstance(row[0], list) else [row[0]]
        stored = []
        for position, envelope in zip(positions, envelopes, strict=True):
            envelope.store_position = position
            stored.append(StoredEvent(int(position), envelope))
        return stored

    def _append_statement(
        self, stream_id: str, expected_version: int, events: Sequence[NewEvent]
    ) -> tuple[str, tuple[object, ...], list[events_pb2.EventEnvelope]]:
        """The statement that appends ``events``, its parameters (one row's, or arrays) and the envelopes."""
        built = [self._envelope(stream_id, expected_version + i, event) for i, event in enumerate(events, 1)]
        envelopes = [e for e, _ in built]
        columns = (
            [e.event_id for e in envelopes],
            [e.event_type for e in envelopes],
            [e.correlation_id for e in envelopes],
            [occurred for _, occurred in built],
            [e.SerializeToString() for e in envelopes],
            [event.topic or self.default_topic for event in events],
        )
        one = len(events) == 1
        values = tuple(column[0] for column in columns) if one else columns
        params = (stream_id, ordering_domain(stream_id), expected_version, *values, key_hash(stream_id))
        return (_APPEND_ONE if one else _APPEND_MANY), params, envelopes

    def append_call(
        self, stream_id: str, expected_version: int, events: Sequence[NewEvent], *, prefix: str = "a_"
    ) -> tuple[str, dict[str, object]]:
        """A strict append as an SQL expression and its named parameters, to queue or embed in a statement.

        The expression (``niuniu_append_events_strict(...)``, the positions as an array) takes
        the same locks and checks as ``append``; a stream not at ``expected_version`` raises
        ``psycopg.errors.SerializationFailure`` and aborts the caller's transaction. For
        callers that do not wait for the result before they commit: a pipeline (``append_queued``)
        or a statement that appends only when its other writes happened.
        """
        if len(events) == 1:
            event = events[0]
            envelope, occurred = self._envelope(stream_id, expected_version + 1, event)
            one: dict[str, object] = {
                f"{prefix}stream": stream_id,
                f"{prefix}domain": ordering_domain(stream_id),
                f"{prefix}expected": expected_version,
                f"{prefix}id": envelope.event_id,
                f"{prefix}type": envelope.event_type,
                f"{prefix}correlation": envelope.correlation_id,
                f"{prefix}occurred": occurred,
                f"{prefix}envelope": envelope.SerializeToString(),
                f"{prefix}topic": event.topic or self.default_topic,
                f"{prefix}key_hash": key_hash(stream_id),
            }
            return "niuniu_append_event_strict(" + _APPEND_ONE_ARGS.format(p=prefix) + ")", one
        built = [self._envelope(stream_id, expected_version + i, event) for i, event in enumerate(events, 1)]
        envelopes = [e for e, _ in built]
        params: dict[str, object] = {
            f"{prefix}stream": stream_id,
            f"{prefix}domain": ordering_domain(stream_id),
            f"{prefix}expected": expected_version,
            f"{prefix}ids": [e.event_id for e in envelopes],
            f"{prefix}types": [e.event_type for e in envelopes],
            f"{prefix}correlations": [e.correlation_id for e in envelopes],
            f"{prefix}occurred": [occurred for _, occurred in built],
            f"{prefix}envelopes": [e.SerializeToString() for e in envelopes],
            f"{prefix}topics": [event.topic or self.default_topic for event in events],
            f"{prefix}key_hash": key_hash(stream_id),
        }
        return "niuniu_append_events_strict(" + _APPEND_ARGS.format(p=prefix) + ")", params

    async def append_queued(
        self, conn: psycopg.AsyncConnection, stream_id: str, expected_version: int, events: Sequence[NewEvent]
    ) -> None:
        """``append`` without reading its result: in pipeline mode it travels with the commit.

        In the caller's transaction; a stream not at ``expected_version`` raises
        ``psycopg.errors.SerializationFailure`` when the pipeline syncs (the transaction then
        rolls back: retry it).
        """
        if not events:
            return
        call, params = self.append_call(stream_id, expected_version, events)
        await note_trace(conn)
        await conn.execute("SELECT " + call, params)

    def _envelope(self, stream_id: str, version: int, event: NewEvent) -> tuple[events_pb2.EventEnvelope, datetime]:
        """The event's envelope and its time as stored in ``events.occurred_at`` (aware, whole microseconds)."""
        occurred = self._clock()
        if occurred.tzinfo is None:  # a naive clock reads UTC, as Timestamp.FromDatetime takes it
            occurred = occurred.replace(tzinfo=UTC)
        envelope = build_envelope(
            event_id=str(self._new_id()),
            stream_id=stream_id,
            version=version,
            event=event,
            occurred_at=occurred,
            producer=self.producer,
            store_position=0,
        )
        return envelope, occurred

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
        """Events after ``after_position`` in position order; a reader following it never skips one.

        It waits for the appends in flight (``wait_for_appends``), so no event can commit
        later with a smaller position than one returned.
        """
        async with conn.transaction():
            await wait_for_appends(conn)
            cur = await conn.execute(
                "SELECT position, envelope FROM events WHERE position > %s ORDER BY position LIMIT %s",
                (after_position, limit),
            )
            return [_stored(row) for row in await cur.fetchall()]

    async def read_correlated(
        self, conn: psycopg.AsyncConnection, correlation_id: str, stream_id: str | None = None
    ) -> list[StoredEvent]:
        """The events of one correlation id, in position order; with ``stream_id``, those on that stream only
        (a round's on its table's stream, not its bets')."""
        if stream_id is None:
            cur = await conn.execute(
                "SELECT position, envelope FROM events WHERE correlation_id = %s ORDER BY position", (correlation_id,)
            )
        else:
            cur = await conn.execute(
                "SELECT position, envelope FROM events WHERE correlation_id = %s AND stream_id = %s ORDER BY position",
                (correlation_id, stream_id),
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
    if occurred_at.tzinfo is None:  # naive: UTC (as Timestamp.FromDatetime reads it)
        occurred_at = occurred_at.replace(tzinfo=UTC)
    since_epoch = occurred_at - _EPOCH
    ts = timestamp_pb2.Timestamp(
        seconds=since_epoch.days * 86_400 + since_epoch.seconds, nanos=occurred_at.microsecond * 1000
    )
    value = event.payload.SerializeToString()
    if len(value) > MAX_PAYLOAD_BYTES:
        raise EventTooLarge(event.event_type, len(value))
    payload = any_pb2.Any(type_url=_TYPE_URL_PREFIX + event.payload.DESCRIPTOR.full_name, value=value)
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
    envelope.store_position = int(row[0])
    return StoredEvent(int(row[0]), envelope)


def stored_event(row: tuple[int, bytes]) -> StoredEvent:
    """A (position, envelope bytes) row of ``events`` as a StoredEvent (for services' own queries)."""
    return _stored(row)
