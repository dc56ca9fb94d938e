"""Rebuild a projection from Kafka offset 0 into fresh tables.

A projection is the pair (DDL, handler). The live consumer applies the handler
in the service's schema; a replay creates a fresh PostgreSQL schema, reads every
partition of the topics from the beginning up to the end offsets seen when it
started, and applies the same handler with the same exactly-once rules. The
two results can then be compared table by table.

A replay works a poll (up to ``MAX_REPLAY_POLL_RECORDS``) at a time, in one transaction.
It first writes the poll as if every event were new, under a savepoint: the tracking rows
copied straight into ``processed_events`` with one COPY, and the events applied by the
projection's ``stager`` when it has one (the poll's rows prepared off the event loop,
written with COPY and plain inserts, ``StagedBatch.write_all_new``), else its
``batch_handler``, else the handler with the statements pipelined. An event tracked
already or read twice, or a row its effects would skip (one there already), fails that
with a unique violation, and the poll is written again the careful way: its tracking rows
staged with one COPY and recorded in one statement, which also leaves the poll indexes of
the events seen for the first time in the temporary table ``replay_fresh (n)``, and the
stager's ``write``, which keeps the fresh events only and skips rows there already. Either
way the effects are the handler's, applied event by event, in order. Decoding and staging the next
poll (a worker thread) overlaps with PostgreSQL writing the previous one. The two threads
share the interpreter lock: while a replay runs the interpreter hands it over every
millisecond instead of every 5 (``sys.setswitchinterval``), so the writer gets it back
soon after each of its round trips instead of waiting out the stager's turn with
PostgreSQL idle.

The scratch schema is thrown away after the comparison, so its tables are UNLOGGED (no
WAL) and the session commits without waiting for a WAL flush. The projection's plain
(non-unique) indexes are built once at the end instead of row by row (or not at all,
``indexes=False``: a replay only compared reads none of them), and its foreign keys
are put back at the end (each checked once over the whole table instead of by a trigger per
row). Unique constraints the exactly-once rules rely on exist from the start; those a projection
names as ``implied_unique`` (kept anyway, because each event is applied once) are also put back
at the end, so each is checked once, and a replay that broke one fails there.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from kafka import KafkaConsumer, TopicPartition
from niuniu.v1 import events_pb2
from psycopg import sql

from backbone.consumer import TRACKING_SCHEMA, ApplyMany, Handler, Tracked
from backbone.db import create_schema, run_ddl
from backbone.kafka import make_consumer

MAX_REPLAY_POLL_RECORDS = 5_000
# The first poll, staged while the scratch schema is made: short, as nothing is written until it is staged.
FIRST_POLL_RECORDS = 500
# Fetch sizes: a poll's records come in a few large fetches instead of many 1 MiB ones.
REPLAY_PARTITION_FETCH_BYTES = 8 * 1024 * 1024
REPLAY_FETCH_BYTES = 64 * 1024 * 1024
POLL_TIMEOUT_MS = 500
# How long a thread keeps the interpreter lock while another waits for it, during a replay (Python's
# default: 5 ms). At 5 ms the writer, woken by PostgreSQL's answer, waited for the stager's turn to end
# at each of a poll's round trips: 12 200-12 600 events/s in ``niuniu-audit bench-replay``, 15 100-15 500
# at 1 ms (and no better at 0.5 or 0.2 ms).
REPLAY_SWITCH_INTERVAL_S = 0.001
# Connections building the deferred indexes and constraints at the end of a replay, a table each.
REPLAY_BUILD_CONNECTIONS = 2


class StagedBatch(Protocol):
    """A poll prepared by a projection's stager (pure work, done on a worker thread)."""

    async def write(self, conn: psycopg.AsyncConnection, stale: frozenset[int]) -> None:
        """Apply the events of the poll whose index is in ``replay_fresh`` (``stale``: the other indexes)."""

    async def write_all_new(self, conn: psycopg.AsyncConnection) -> None:
        """Apply every event of the poll, with plain inserts: a row its effects would skip (one there
        already) raises ``UniqueViolation``, and the replay then undoes this and calls ``write``."""


# Prepares the poll's events (index = position in the sequence) for writing; no I/O.
Stager = Callable[[Sequence[Tracked]], StagedBatch]


@dataclass(frozen=True, slots=True)
class Projection:
    name: str
    ddl: Sequence[str]
    handler: Handler
    tables: Sequence[str]
    # Optional: applies several events (new ones, in order) with the effects of ``handler`` on each.
    batch_handler: ApplyMany | None = None
    # Optional, replay only: prepares a whole poll off the event loop; its ``write`` applies the fresh
    # events with the effects of ``handler`` on each, in order. ``stage_ddl``: its temporary tables.
    stager: Stager | None = None
    stage_ddl: Sequence[str] = ()
    # Replay only: unique constraints (by name) no write of the projection relies on, because applying
    # each event once already keeps them: built at the end of a replay instead of row by row.
    implied_unique: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class ReplayReport:
    schema: str
    events_read: int
    events_applied: int
    seconds: float


def fresh_stage(on_commit: str = "DELETE ROWS") -> str:
    """The indexes of a batch's events applied for the first time, as a ``StagedBatch`` reads them."""
    return f"CREATE TEMP TABLE IF NOT EXISTS replay_fresh (n INT PRIMARY KEY) ON COMMIT {on_commit}"


FRESH_STAGE = fresh_stage()

_REPLAY_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS replay_polled"
    ' (n INT, event_id UUID, topic TEXT, partition INT, "offset" BIGINT) ON COMMIT DELETE ROWS',
    FRESH_STAGE,
)

# The poll's tracking rows, in poll order; an event read twice is new once (its first copy).
_RECORD_POLLED = """
WITH recorded AS (
    INSERT INTO processed_events (consumer, event_id, topic, partition, "offset")
    SELECT %s, event_id, topic, partition, "offset" FROM replay_polled ORDER BY n
    ON CONFLICT DO NOTHING RETURNING event_id
), fresh AS (
    INSERT INTO replay_fresh (n)
    SELECT min(p.n) FROM replay_polled p JOIN recorded USING (event_id) GROUP BY p.event_id
    RETURNING n
)
SELECT count(*) FROM fresh
"""

# The usual poll: every event new. Recorded without ON CONFLICT (its speculative insertion and the
# matching of what was inserted took 45 ms of a poll of 5 000 here, this 19 ms and the fresh indexes
# 6 ms more), and in no particular order (``_RECORD_POLLED`` orders its rows so that an event's first
# copy is the one tracked; here there is one copy of each); an event tracked already or twice in the
# poll fails it, and the poll is then recorded by ``_RECORD_POLLED``.
_RECORD_POLLED_NEW = """
WITH recorded AS (
    INSERT INTO processed_events (consumer, event_id, topic, partition, "offset")
    SELECT %s, event_id, topic, partition, "offset" FROM replay_polled
)
INSERT INTO replay_fresh (n) SELECT n FROM replay_polled
"""

# The usual poll (any projection): every event new, its tracking rows copied straight in (a row there already
# fails the copy, and the poll is then recorded as above).
_COPY_PROCESSED = 'COPY processed_events (consumer, event_id, topic, partition, "offset") FROM STDIN'

_PLAIN_INDEX = re.compile(r"\s*CREATE\s+INDEX\s", re.IGNORECASE)
_INDEX_TABLE = re.compile(r"\sON\s+(?:ONLY\s+)?([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


async def replay(
    dsn: str,
    bootstrap_servers: str,
    topics: Sequence[str],
    projection: Projection,
    schema: str,
    *,
    progress: Callable[[int, int], None] | None = None,
    indexes: bool = True,
) -> ReplayReport:
    """Rebuild ``projection`` from offset 0 of ``topics`` into the fresh ``schema``.

    ``indexes=False``: the projection's plain (non-unique) indexes are not built. They are access
    paths only: a replay read whole, compared and dropped (the audit's) reads none of them, and they
    took 1.2-1.5 s of an 8 s replay of 200 000 events. Its constraints are built either way: they
    are what the replay is checked against.
    """
    started = time.perf_counter()
    consumer = replay_consumer(bootstrap_servers, f"replay-{projection.name}")
    # The partitions, their end offsets and the first poll (``_open``) come from a worker thread.
    opening = asyncio.ensure_future(asyncio.to_thread(_open, consumer, topics, projection))
    _quick_switch.enter()
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await create_schema(conn, schema, fresh=True)
            await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
            await conn.execute("SET synchronous_commit = off")  # a scratch schema: nothing to lose in a crash
            await conn.commit()
            later = plain_indexes(projection) if indexes else []
            await run_ddl(conn, [*TRACKING_SCHEMA, *(s for s in projection.ddl if not _PLAIN_INDEX.match(s))])
            put_back = await _scratch_tables(conn, schema, projection.implied_unique)
            await run_ddl(conn, [*_REPLAY_STAGE, *projection.stage_ddl])
            end, remaining, first = await opening
            read, applied = (
                (0, 0) if first is None else await _drain(first, consumer, conn, projection, end, remaining, progress)
            )
            await _build_deferred(dsn, conn, schema, later, put_back)
    finally:
        # Waited for (the consumer is closed next) and its outcome taken, also when the set-up failed first.
        await asyncio.gather(opening, return_exceptions=True)
        _quick_switch.leave()
        consumer.close()
    return ReplayReport(schema, read, applied, time.perf_counter() - started)


def plain_indexes(projection: Projection) -> list[str]:
    """The projection's plain (non-unique) indexes: built at the end of a replay, or not at all."""
    return [s for s in projection.ddl if _PLAIN_INDEX.match(s)]


async def build_indexes(dsn: str, schema: str, statements: Sequence[str]) -> None:
    """Build ``statements`` (plain indexes) on the replayed ``schema`` as a replay's end builds them."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
        await _build_deferred(dsn, conn, schema, statements, [])


class _QuickSwitch:
    """``REPLAY_SWITCH_INTERVAL_S`` while any replay of the process runs; the interval before, after the last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._before = 0.0

    def enter(self) -> None:
        with self._lock:
            if self._running == 0:
                self._before = sys.getswitchinterval()
                sys.setswitchinterval(min(self._before, REPLAY_SWITCH_INTERVAL_S))
            self._running += 1

    def leave(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                sys.setswitchinterval(self._before)


_quick_switch = _QuickSwitch()


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


@dataclass(frozen=True, slots=True)
class _Deferred:
    """A statement built once at the end of a replay: a plain index or a constraint put back."""

    table: str
    statement: str | sql.Composed
    foreign_key: bool = False


async def _scratch_tables(conn: psycopg.AsyncConnection, schema: str, implied_unique: Sequence[str]) -> list[_Deferred]:
    """Make the scratch schema's tables UNLOGGED; take their foreign keys and ``implied_unique``
    constraints off until the end.

    Returns the statements that put them back: each is then checked once, over the whole replayed
    table, instead of on every row inserted.
    """
    async with conn.transaction():
        cur = await conn.execute(
            "SELECT r.relname, k.conname, pg_get_constraintdef(k.oid), k.contype = 'f' FROM pg_constraint k"
            " JOIN pg_class r ON r.oid = k.conrelid JOIN pg_namespace s ON s.oid = r.relnamespace"
            " WHERE s.nspname = %s AND (k.contype = 'f' OR k.conname = ANY(%s))"
            " ORDER BY k.contype = 'f', 1, 2",
            (schema, list(implied_unique)),
        )
        taken_off = [(str(r[0]), str(r[1]), str(r[2]), bool(r[3])) for r in await cur.fetchall()]
        missing = set(implied_unique) - {name for _, name, _, _ in taken_off}
        if missing:
            raise ValueError(f"implied_unique names no constraint of the projection: {sorted(missing)}")
        for table, name, _, _ in reversed(taken_off):  # foreign keys first: they may need a unique one
            await conn.execute(
                sql.SQL("ALTER TABLE {}.{} DROP CONSTRAINT {}").format(
                    sql.Identifier(schema), sql.Identifier(table), sql.Identifier(name)
                )
            )
        cur = await conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace"
            " WHERE s.nspname = %s AND c.relkind = 'r' ORDER BY 1",
            (schema,),
        )
        for (table,) in await cur.fetchall():
            await conn.execute(
                sql.SQL("ALTER TABLE {}.{} SET UNLOGGED").format(sql.Identifier(schema), sql.Identifier(str(table)))
            )
    return [
        _Deferred(
            table,
            sql.SQL("ALTER TABLE {}.{} ADD CONSTRAINT {} {}").format(
                sql.Identifier(schema), sql.Identifier(table), sql.Identifier(name), sql.SQL(definition)
            ),
            foreign_key=foreign_key,
        )
        for table, name, definition, foreign_key in taken_off
    ]


async def _build_deferred(
    dsn: str, conn: psycopg.AsyncConnection, schema: str, indexes: Sequence[str], put_back: Sequence[_Deferred]
) -> None:
    """The plain indexes and the constraints taken off, built once over the replayed tables.

    Table by table, up to ``REPLAY_BUILD_CONNECTIONS`` tables side by side (the largest first), each
    on a connection of its own: the tables' plain indexes and unique constraints; then, on ``conn``,
    the foreign keys, which may need a unique constraint built in the first step. Nothing waits for
    another connection's lock: a plain index or a unique constraint locks only its own table.
    """
    by_table: dict[str, list[str | sql.Composed]] = {}
    for statement in indexes:
        found = _INDEX_TABLE.search(statement)
        if found is None:
            raise ValueError(f"no table named in the projection's index: {statement!r}")
        by_table.setdefault(found.group(1), []).append(statement)
    for deferred in put_back:
        if not deferred.foreign_key:
            by_table.setdefault(deferred.table, []).append(deferred.statement)
    cur = await conn.execute(
        "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace"
        " WHERE s.nspname = %s AND c.relkind = 'r'",
        (schema,),
    )
    sizes = {str(name): int(size) for name, size in await cur.fetchall()}
    await conn.commit()
    waiting = sorted(by_table.items(), key=lambda item: -sizes.get(item[0], 0))

    async def builder() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            await other.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
            await other.execute("SET statement_timeout = 0")  # each built once over the whole replay
            while waiting:
                _, statements = waiting.pop(0)
                for statement in statements:
                    await other.execute(statement)

    builders = [asyncio.ensure_future(builder()) for _ in range(min(REPLAY_BUILD_CONNECTIONS, len(waiting)))]
    try:
        await asyncio.gather(*builders)
    except BaseException:  # the first failure is the replay's; the other builders stop
        for task in builders:
            task.cancel()
        await asyncio.gather(*builders, return_exceptions=True)
        raise
    async with conn.transaction():
        await conn.execute("SET LOCAL statement_timeout = 0")
        for deferred in put_back:
            if deferred.foreign_key:
                await conn.execute(deferred.statement)


@dataclass(slots=True)
class _Poll:
    polled: list[Tracked]
    tracking: bytes  # processed_events' rows of the poll (consumer, event_id, topic, partition, offset), COPY text
    staged: StagedBatch | None
    done: bool


def _open(
    consumer: Any, topics: Sequence[str], projection: Projection
) -> tuple[dict[TopicPartition, int], set[TopicPartition], _Poll | None]:
    """Assign every partition of ``topics`` from its start: their end offsets, the partitions with
    records before them, and the first poll (short) decoded and staged; None when there is none."""
    partitions = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    end = consumer.end_offsets(partitions)
    remaining = {tp for tp, offset in end.items() if offset > 0}
    first = _poll_and_stage(consumer, projection, end, remaining, FIRST_POLL_RECORDS) if remaining else None
    return end, remaining, first


def _poll_and_stage(
    consumer: Any,
    projection: Projection,
    end: dict[TopicPartition, int],
    remaining: set[TopicPartition],
    max_records: int = MAX_REPLAY_POLL_RECORDS,
) -> _Poll:
    """One poll, decoded and staged (runs on a worker thread; ``remaining`` is updated)."""
    batches = consumer.poll(POLL_TIMEOUT_MS, max_records=max_records)
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
    staged = projection.stager(polled) if polled and projection.stager is not None else None
    return _Poll(polled, "".join(rows).encode(), staged, not remaining)


async def _drain(
    first: _Poll,
    consumer: object,
    conn: psycopg.AsyncConnection,
    projection: Projection,
    end: dict[TopicPartition, int],
    remaining: set[TopicPartition],
    progress: Callable[[int, int], None] | None = None,
) -> tuple[int, int]:
    """Write ``first`` and every poll after it up to ``end``; (events read, events new)."""
    read = applied = 0
    total = sum(end.values())
    poll: _Poll | None = first
    while poll is not None:
        # The next poll is read and staged while this one is written.
        upcoming = (
            None
            if poll.done
            else asyncio.ensure_future(asyncio.to_thread(_poll_and_stage, consumer, projection, end, remaining))
        )
        if poll.polled:
            read += len(poll.polled)
            try:
                async with conn.transaction():
                    applied += await _apply(conn, projection, poll)
            except BaseException:
                if upcoming is not None:
                    await asyncio.gather(upcoming, return_exceptions=True)  # the consumer is closed next
                raise
        if progress is not None:
            progress(read, total)
        poll = None if upcoming is None else await upcoming
    return read, applied


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_text(value: str) -> str:
    """``value`` as a field of PostgreSQL's COPY text format."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_COPY_ESCAPES)
    return value


async def _apply(conn: psycopg.AsyncConnection, projection: Projection, poll: _Poll) -> int:
    """Record the poll as processed and apply the new events; returns how many were new.

    First as if every event were new: the tracking rows copied straight in and the effects written with
    plain inserts (``StagedBatch.write_all_new``), under a savepoint. An event tracked already or read
    twice, or a row its effects would skip, fails that with a unique violation; the poll is then written
    again the careful way (``_apply_carefully``)."""
    try:
        async with conn.transaction():
            async with conn.cursor().copy(_COPY_PROCESSED) as copy:
                await copy.write(poll.tracking)
            await _write(conn, projection, poll, frozenset())
        return len(poll.polled)
    except psycopg.errors.UniqueViolation:
        pass
    return await _apply_carefully(conn, projection, poll)


async def _apply_carefully(conn: psycopg.AsyncConnection, projection: Projection, poll: _Poll) -> int:
    """``_apply`` of a poll with events tracked already or read twice, or rows there already."""
    cur = conn.cursor()
    async with cur.copy('COPY replay_polled (n, event_id, topic, partition, "offset") FROM STDIN') as copy:
        await copy.write(
            "".join(
                f"{n}\t{copy_text(t.envelope.event_id)}\t{copy_text(t.topic)}\t{t.partition}\t{t.offset}\n"
                for n, t in enumerate(poll.polled)
            ).encode()
        )
    try:
        async with conn.transaction():  # a savepoint: only this statement is undone if it fails
            await cur.execute(_RECORD_POLLED_NEW, (projection.name,))
        fresh_count = len(poll.polled)
    except psycopg.errors.UniqueViolation:
        await cur.execute(_RECORD_POLLED, (projection.name,))
        row = await cur.fetchone()
        fresh_count = int(row[0]) if row else 0
    stale: frozenset[int] = frozenset()
    if fresh_count < len(poll.polled):
        await cur.execute("SELECT n FROM replay_polled WHERE n NOT IN (SELECT n FROM replay_fresh)")
        stale = frozenset(int(r[0]) for r in await cur.fetchall())
    await _write(conn, projection, poll, stale, careful=True)
    return fresh_count


async def _write(
    conn: psycopg.AsyncConnection, projection: Projection, poll: _Poll, stale: frozenset[int], *, careful: bool = False
) -> None:
    """The effects of the poll's events but the ``stale`` ones (``careful``: some rows may be there already)."""
    if poll.staged is not None:
        if careful:
            await poll.staged.write(conn, stale)
        else:
            await poll.staged.write_all_new(conn)
        return
    fresh = [tracked for n, tracked in enumerate(poll.polled) if n not in stale]
    if projection.batch_handler is not None:
        await projection.batch_handler(conn, fresh)
    else:
        async with conn.pipeline():
            for tracked in fresh:
                await projection.handler(conn, tracked.envelope)


async def table_digest(
    conn: psycopg.AsyncConnection, schema: str, table: str, order_by: str
) -> list[tuple[object, ...]]:
    """Every row of ``schema.table`` in a stable order, for comparing a replay with the live projection."""
    query = sql.SQL("SELECT * FROM {}.{} ORDER BY {}").format(
        sql.Identifier(schema), sql.Identifier(table), sql.SQL(order_by)
    )
    cur = await conn.execute(query)
    return list(await cur.fetchall())
