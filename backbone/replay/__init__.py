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
import time
from collections.abc import Callable, Mapping, Sequence

import psycopg
from kafka import KafkaConsumer, TopicPartition

from backbone.db import run_ddl
from backbone.replay.model import Archived, Observer, Projection, ReplayReport
from backbone.replay.reading import Opened, open_topics, replay_consumer
from backbone.replay.scratch import build_deferred, plain_indexes, scratch_schema
from backbone.replay.workers import Options, replay_workers
from backbone.replay.writing import REPLAY_STAGE, apply_archived, drain, quick_switch


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
    ``workers`` > 0: the partitions are replayed by that many processes side by side (``replay_workers``),
    each held to ``cpu_per_worker`` of a core when that is > 0; 0 replays them here.
    """
    if workers > 0:
        return await replay_workers(
            dsn, bootstrap_servers, topics, projection, schema, Options(progress, indexes, observe, archived),
            workers, cpu_per_worker,
        )  # fmt: skip
    started = time.perf_counter()
    consumer = replay_consumer(bootstrap_servers, f"replay-{projection.name}")
    # The partitions, their end offsets and the first poll (``open_topics``) come from a worker thread (after the
    # archive's records, when there is an archive: ``observe`` is shown the records in order).
    opening = None if archived else _opening(consumer, topics, projection, observe)
    quick_switch.enter()
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            put_back = await scratch_schema(conn, schema, projection)
            later = plain_indexes(projection) if indexes else []
            await run_ddl(conn, [*REPLAY_STAGE, *projection.stage_ddl])
            read = applied = 0
            if archived is not None:
                read, applied = await apply_archived(conn, projection, archived.batches, observe)
                opening = _opening(consumer, topics, projection, observe, archived.starts)
            assert opening is not None
            live_read, live_applied = await _drain_opened(opening, consumer, conn, projection, progress, observe)
            read, applied = read + live_read, applied + live_applied
            await build_deferred(dsn, conn, schema, later, put_back)
    finally:
        # Waited for (the consumer is closed next) and its outcome taken, also when the set-up failed first.
        if opening is not None:
            await asyncio.gather(opening, return_exceptions=True)
        quick_switch.leave()
        consumer.close()
    return ReplayReport(schema, read, applied, time.perf_counter() - started)


def _opening(
    consumer: KafkaConsumer,
    topics: Sequence[str],
    projection: Projection,
    observe: Observer | None,
    starts: Mapping[TopicPartition, int] | None = None,
) -> asyncio.Future[Opened]:
    """``open_topics`` on a worker thread."""
    return asyncio.ensure_future(asyncio.to_thread(open_topics, consumer, topics, projection, observe, starts))


async def _drain_opened(
    opening: asyncio.Future[Opened],
    consumer: KafkaConsumer,
    conn: psycopg.AsyncConnection,
    projection: Projection,
    progress: Callable[[int, int], None] | None,
    observe: Observer | None,
) -> tuple[int, int]:
    """Once ``opening`` is done, write its first poll and every poll after it; (events read, events new)."""
    end, remaining, first = await opening
    if first is None:
        return 0, 0
    return await drain(first, consumer, conn, projection, end, remaining, progress, observe)
