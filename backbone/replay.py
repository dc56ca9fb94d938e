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
import contextlib
import dataclasses
import multiprocessing
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

import psycopg
from kafka import KafkaConsumer, TopicPartition
from niuniu.v1 import events_pb2
from psycopg import sql

from backbone.consumer import TRACKING_SCHEMA, ApplyMany, Handler, Tracked
from backbone.cpuquota import CpuGroups
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
MAX_REPLAY_WORKERS = 64
# How often a replay by worker processes looks at them (their progress, an early failure).
WORKER_WATCH_S = 0.5
# The CPU cgroup under which a replay's workers get their quota (``cpu_per_worker``).
WORKER_QUOTA_PARENT = "niuniu-replay"


class StagedBatch(Protocol):
    """A poll prepared by a projection's stager (pure work, done on a worker thread)."""

    async def write(self, conn: psycopg.AsyncConnection, stale: frozenset[int]) -> None:
        """Apply the events of the poll whose index is in ``replay_fresh`` (``stale``: the other indexes)."""

    async def write_all_new(self, conn: psycopg.AsyncConnection) -> None:
        """Apply every event of the poll, with plain inserts: a row its effects would skip (one there
        already) raises ``UniqueViolation``, and the replay then undoes this and calls ``write``."""


# Prepares the poll's events (index = position in the sequence) for writing; no I/O.
Stager = Callable[[Sequence[Tracked]], StagedBatch]
# Shown each poll a replay reads, in the order read (on the replay's worker thread); no I/O.
Observer = Callable[[Sequence[Tracked]], None]


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
class Archived:
    """Records read before Kafka's (``backbone.archive``): their batches, in order, and per partition the
    offset Kafka is read from after them (the archive's end)."""

    batches: Iterable[Sequence[Tracked]]
    starts: Mapping[TopicPartition, int]


class ReplayGap(RuntimeError):
    """Kafka no longer holds records the replay needs (deleted by retention, and not given by an archive)."""


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
    observe: Observer | None = None,
    workers: int = 0,
    cpu_per_worker: float = 0.0,
    archived: Archived | None = None,
) -> ReplayReport:
    """Rebuild ``projection`` from offset 0 of ``topics`` into the fresh ``schema``.

    ``archived``: its records first, then Kafka's from the offsets it names (``ReplayGap`` if Kafka
    no longer holds a record the replay needs).

    ``indexes=False``: the projection's plain (non-unique) indexes are not built. They are access
    paths only: a replay read whole, compared and dropped (the audit's) reads none of them, and they
    took 1.2-1.5 s of an 8 s replay of 200 000 events. Its constraints are built either way: they
    are what the replay is checked against.

    ``observe`` is given every poll read, in the order read (the audit's settlement reconciler).
    ``workers`` > 0: the partitions are replayed by that many processes side by side (``_replay_workers``),
    each held to ``cpu_per_worker`` of a core when that is > 0; 0 replays them here.
    """
    if workers > 0:
        return await _replay_workers(
            dsn, bootstrap_servers, topics, projection, schema, _Options(progress, indexes, observe, archived),
            workers, cpu_per_worker,
        )  # fmt: skip
    started = time.perf_counter()
    consumer = replay_consumer(bootstrap_servers, f"replay-{projection.name}")
    starts = dict(archived.starts) if archived is not None else {}
    # The partitions, their end offsets and the first poll (``_open``) come from a worker thread (after the
    # archive's records, when there is an archive: ``observe`` is shown the records in order).
    opening: asyncio.Future[Any] | None = (
        None if archived else asyncio.ensure_future(asyncio.to_thread(_open, consumer, topics, projection, observe))
    )
    _quick_switch.enter()
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            put_back = await _scratch_schema(conn, schema, projection)
            later = plain_indexes(projection) if indexes else []
            await run_ddl(conn, [*_REPLAY_STAGE, *projection.stage_ddl])
            read = applied = 0
            if archived is not None:
                read, applied = await _apply_archived(conn, projection, archived.batches, observe)
                opening = asyncio.ensure_future(asyncio.to_thread(_open, consumer, topics, projection, observe, starts))
            assert opening is not None
            end, remaining, first = await opening
            live_read, live_applied = (
                (0, 0)
                if first is None
                else await _drain(first, consumer, conn, projection, end, remaining, progress, observe)
            )
            read, applied = read + live_read, applied + live_applied
            await _build_deferred(dsn, conn, schema, later, put_back)
    finally:
        # Waited for (the consumer is closed next) and its outcome taken, also when the set-up failed first.
        if opening is not None:
            await asyncio.gather(opening, return_exceptions=True)
        _quick_switch.leave()
        consumer.close()
    return ReplayReport(schema, read, applied, time.perf_counter() - started)


async def _scratch_schema(conn: psycopg.AsyncConnection, schema: str, projection: Projection) -> list[_Deferred]:
    """The fresh ``schema`` with the projection's tables but its plain indexes (``_scratch_tables``), ``conn``
    writing there without waiting for WAL flushes; the constraints to put back at the end."""
    await create_schema(conn, schema, fresh=True)
    await _use_scratch(conn, schema)
    await run_ddl(conn, [*TRACKING_SCHEMA, *(s for s in projection.ddl if not _PLAIN_INDEX.match(s))])
    return await _scratch_tables(conn, schema, projection.implied_unique)


async def _use_scratch(conn: psycopg.AsyncConnection, schema: str) -> None:
    await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
    await conn.execute("SET synchronous_commit = off")  # a scratch schema: nothing to lose in a crash
    await conn.commit()


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
    consumer: Any,
    topics: Sequence[str],
    projection: Projection,
    observe: Observer | None = None,
    starts: Mapping[TopicPartition, int] | None = None,
) -> tuple[dict[TopicPartition, int], set[TopicPartition], _Poll | None]:
    """Assign every partition of ``topics`` from its start (``starts``, else 0): their end offsets, the
    partitions with records before them, and the first poll (short) decoded and staged; None when there is none."""
    partitions = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
    return _open_partitions(consumer, partitions, projection, observe, None, starts)


def _open_partitions(
    consumer: Any,
    partitions: Sequence[TopicPartition],
    projection: Projection,
    observe: Observer | None = None,
    end: dict[TopicPartition, int] | None = None,
    starts: Mapping[TopicPartition, int] | None = None,
) -> tuple[dict[TopicPartition, int], set[TopicPartition], _Poll | None]:
    """``_open`` of the given partitions (up to ``end`` when given, else their end offsets now)."""
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
    first = _poll_and_stage(consumer, projection, end, remaining, FIRST_POLL_RECORDS, observe) if remaining else None
    return end, remaining, first


def _poll_and_stage(
    consumer: Any,
    projection: Projection,
    end: dict[TopicPartition, int],
    remaining: set[TopicPartition],
    max_records: int = MAX_REPLAY_POLL_RECORDS,
    observe: Observer | None = None,
) -> _Poll:
    """One poll, decoded, shown to ``observe`` and staged (runs on a worker thread; ``remaining`` is updated)."""
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
    if observe is not None and polled:
        observe(polled)
    staged = projection.stager(polled) if polled and projection.stager is not None else None
    return _Poll(polled, "".join(rows).encode(), staged, not remaining)


def _archived_poll(projection: Projection, batch: Sequence[Tracked], observe: Observer | None) -> _Poll:
    """An archived batch as a poll: shown to ``observe``, its tracking rows, staged (on a worker thread)."""
    polled = list(batch)
    if observe is not None and polled:
        observe(polled)
    name = copy_text(projection.name)
    rows = "".join(
        f"{name}\t{copy_text(t.envelope.event_id)}\t{copy_text(t.topic)}\t{t.partition}\t{t.offset}\n" for t in polled
    )
    staged = projection.stager(polled) if polled and projection.stager is not None else None
    return _Poll(polled, rows.encode(), staged, False)


async def _apply_archived(
    conn: psycopg.AsyncConnection,
    projection: Projection,
    batches: Iterable[Sequence[Tracked]],
    observe: Observer | None,
) -> tuple[int, int]:
    """Write the archive's batches in order, as polls; (events read, events new)."""
    read = applied = 0
    source = iter(batches)

    def next_poll() -> _Poll | None:
        batch = next(source, None)
        return None if batch is None else _archived_poll(projection, batch, observe)

    while (poll := await asyncio.to_thread(next_poll)) is not None:
        read += len(poll.polled)
        async with conn.transaction():
            applied += await _apply(conn, projection, poll)
    return read, applied


async def _drain(
    first: _Poll,
    consumer: object,
    conn: psycopg.AsyncConnection,
    projection: Projection,
    end: dict[TopicPartition, int],
    remaining: set[TopicPartition],
    progress: Callable[[int, int], None] | None = None,
    observe: Observer | None = None,
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
            else asyncio.ensure_future(
                asyncio.to_thread(
                    _poll_and_stage, consumer, projection, end, remaining, MAX_REPLAY_POLL_RECORDS, observe
                )
            )
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


# --- worker processes -----------------------------------------------------------------------------------
#
# A replay by ``workers`` processes divides the partitions among them (about as many records each) and
# each writes its partitions' events into the one scratch schema, made and finished (the deferred indexes
# and constraints) by the calling process. Nothing a poll writes depends on another partition's events
# having been written first: an event and its copies share a key, so a partition; the entries' and
# rounds' keys come from the events, ``seq`` (the one value that follows the order of writing) is
# compared by nobody, and balances are sums. Two polls of different workers that touch one balance row
# wait for each other's commit (the upserts lock rows in one order, so they cannot deadlock). An entry id
# journaled from events of two partitions is one event's entry and the other's reject, whichever comes
# first, as between the polls of a single reader (and between the live consumer's partitions).


class ReplayWorkerFailed(RuntimeError):
    """A worker process of a replay failed; the replay is not complete."""


@dataclass(frozen=True, slots=True)
class _Options:
    progress: Callable[[int, int], None] | None
    indexes: bool
    observe: Observer | None
    archived: Archived | None = None


async def _replay_workers(
    dsn: str,
    bootstrap_servers: str,
    topics: Sequence[str],
    projection: Projection,
    schema: str,
    options: _Options,
    workers: int,
    cpu_per_worker: float,
) -> ReplayReport:
    """``replay`` by ``workers`` processes; ``options.observe`` is shown every record by a reader of this
    process, alongside (all partitions, one poll at a time, as a replay in one process reads them)."""
    if not 1 <= workers <= MAX_REPLAY_WORKERS:
        raise ValueError(f"workers must be 1..{MAX_REPLAY_WORKERS}, not {workers}")
    started = time.perf_counter()
    consumer = replay_consumer(bootstrap_servers, f"replay-{projection.name}")
    watching: asyncio.Future[None] | None = None
    try:
        end = await asyncio.to_thread(_end_offsets, consumer, topics)
        starts = dict(options.archived.starts) if options.archived is not None else {}
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            put_back = await _scratch_schema(conn, schema, projection)
            first_read = first_applied = 0
            if options.archived is not None:  # the archive first, in this process
                await run_ddl(conn, [*_REPLAY_STAGE, *projection.stage_ddl])
                first_read, first_applied = await _apply_archived(
                    conn, projection, options.archived.batches, options.observe
                )
            if options.observe is not None:
                watching = asyncio.ensure_future(
                    asyncio.to_thread(
                        _observe_all,
                        consumer,
                        dataclasses.replace(projection, stager=None),
                        end,
                        options.observe,
                        starts,
                    )
                )
            shares = divide({tp: n - starts.get(tp, 0) for tp, n in end.items()}, workers)
            run = _WorkerRun(dsn, bootstrap_servers, schema, projection, shares, end, starts)
            read, applied = await run.until_done(cpu_per_worker, options.progress)
            read, applied = read + first_read, applied + first_applied
            if watching is not None:
                await watching
            later = plain_indexes(projection) if options.indexes else []
            await _build_deferred(dsn, conn, schema, later, put_back)
    finally:
        if watching is not None:
            await asyncio.gather(watching, return_exceptions=True)  # the consumer is closed next
        consumer.close()
    return ReplayReport(schema, read, applied, time.perf_counter() - started)


def _end_offsets(consumer: Any, topics: Sequence[str]) -> dict[TopicPartition, int]:
    partitions = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
    return dict(consumer.end_offsets(partitions))


def divide(end: Mapping[TopicPartition, int], workers: int) -> list[list[TopicPartition]]:
    """The partitions with records, in up to ``workers`` shares of about as many records each: the largest
    first, each to the share with the fewest records so far."""
    shares: list[list[TopicPartition]] = [[] for _ in range(workers)]
    sizes = [0] * workers
    for tp in sorted((tp for tp, n in end.items() if n > 0), key=lambda tp: (-end[tp], tp.topic, tp.partition)):
        smallest = sizes.index(min(sizes))
        shares[smallest].append(tp)
        sizes[smallest] += end[tp]
    return [share for share in shares if share]


def _observe_all(
    consumer: Any,
    reader: Projection,
    end: dict[TopicPartition, int],
    observe: Observer,
    starts: Mapping[TopicPartition, int] | None = None,
) -> None:
    """Show ``observe`` every record of ``end``'s partitions from ``starts``, a poll at a time
    (``reader``: no stager)."""
    _, remaining, poll = _open_partitions(consumer, list(end), reader, observe, end, starts)
    while poll is not None and not poll.done:
        poll = _poll_and_stage(consumer, reader, end, remaining, MAX_REPLAY_POLL_RECORDS, observe)


@dataclass
class _WorkerRun:
    """The worker processes of one replay, one a share of the partitions."""

    dsn: str
    bootstrap_servers: str
    schema: str
    projection: Projection
    shares: list[list[TopicPartition]]
    end: dict[TopicPartition, int]
    starts: dict[TopicPartition, int] = field(default_factory=dict)

    async def until_done(self, cpu_per_worker: float, progress: Callable[[int, int], None] | None) -> tuple[int, int]:
        """Start the workers (each in a CPU group of its own with ``cpu_per_worker`` > 0), report their
        progress until all have ended; (events read, events new), or ``ReplayWorkerFailed``."""
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads or loop inherited
        counters = [context.Value("q", 0, lock=False) for _ in self.shares]
        pipes = [context.Pipe(duplex=False) for _ in self.shares]
        procs = [
            context.Process(
                target=_worker_main,
                args=(
                    self.dsn,
                    self.bootstrap_servers,
                    self.schema,
                    self.projection,
                    self._parts(share),
                    counter,
                    sender,
                ),
                name=f"replay-worker-{i}",
                daemon=True,
            )
            for i, (share, counter, (_, sender)) in enumerate(zip(self.shares, counters, pipes, strict=True), start=1)
        ]
        total = sum(self.end.values())
        with contextlib.ExitStack() as stack:
            groups = stack.enter_context(CpuGroups(WORKER_QUOTA_PARENT)) if cpu_per_worker else None
            stack.callback(_stop, procs)
            tag = uuid.uuid4().hex[:6]
            for i, proc in enumerate(procs, start=1):
                proc.start()
                if groups is not None and proc.pid is not None:
                    groups.cap(f"{tag}-worker-{i}", proc.pid, cpu_per_worker)
            while any(proc.exitcode is None for proc in procs) and all(proc.exitcode in (None, 0) for proc in procs):
                if progress is not None:
                    progress(sum(int(c.value) for c in counters), total)
                await asyncio.sleep(WORKER_WATCH_S)
            outcomes: list[tuple[Any, ...]] = [
                receiver.recv() if receiver.poll() else ("error", f"exit {proc.exitcode}")
                for (receiver, _), proc in zip(pipes, procs, strict=True)
            ]
        failed = [
            f"{proc.name}: {outcome[1]}" for proc, outcome in zip(procs, outcomes, strict=True) if outcome[0] != "done"
        ]
        if failed:
            raise ReplayWorkerFailed("; ".join(failed))
        if progress is not None:
            progress(sum(int(o[1]) for o in outcomes), total)
        return sum(int(o[1]) for o in outcomes), sum(int(o[2]) for o in outcomes)

    def _parts(self, share: list[TopicPartition]) -> list[tuple[str, int, int, int]]:
        return [(tp.topic, tp.partition, self.starts.get(tp, 0), self.end[tp]) for tp in share]


def _stop(procs: Sequence[Any]) -> None:
    """End the workers still running (after a failure of another), and wait for each."""
    for proc in procs:
        if proc.exitcode is None and proc.pid is not None:
            proc.terminate()
    for proc in procs:
        if proc.pid is not None:
            proc.join()


def _worker_main(
    dsn: str,
    bootstrap_servers: str,
    schema: str,
    projection: Projection,
    parts: list[tuple[str, int, int, int]],
    counter: Any,
    sender: Connection,
) -> None:
    """A worker process: replay ``parts`` (topic, partition, start and end offsets) into ``schema``; sends
    ("done", read, applied), or ("error", what) and exits non-zero."""
    try:
        read, applied = asyncio.run(_replay_share(dsn, bootstrap_servers, schema, projection, parts, counter))
    except BaseException as error:
        sender.send(("error", f"{type(error).__name__}: {error}"[:2_000]))
        raise
    sender.send(("done", read, applied))


async def _replay_share(
    dsn: str,
    bootstrap_servers: str,
    schema: str,
    projection: Projection,
    parts: list[tuple[str, int, int, int]],
    counter: Any,
) -> tuple[int, int]:
    """A worker's share: its partitions read up to their end offsets and written into the scratch ``schema``
    made by the replay, poll after poll as a replay in one process writes them."""
    consumer = replay_consumer(bootstrap_servers, f"replay-{projection.name}-worker")
    ends = {TopicPartition(topic, partition): end for topic, partition, _, end in parts}
    starts = {TopicPartition(topic, partition): start for topic, partition, start, _ in parts}
    opening = asyncio.ensure_future(
        asyncio.to_thread(_open_partitions, consumer, list(ends), projection, None, ends, starts)
    )
    _quick_switch.enter()

    def count(read: int, _total: int) -> None:
        counter.value = read

    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await _use_scratch(conn, schema)
            await run_ddl(conn, [*_REPLAY_STAGE, *projection.stage_ddl])
            end, remaining, first = await opening
            return (0, 0) if first is None else await _drain(first, consumer, conn, projection, end, remaining, count)
    finally:
        await asyncio.gather(opening, return_exceptions=True)
        _quick_switch.leave()
        consumer.close()
