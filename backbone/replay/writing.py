"""The replay's writes: each poll recorded as processed and its new events applied, in one transaction,
the next poll read and staged (a worker thread) while PostgreSQL writes this one."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Iterable, Sequence

import psycopg
from kafka import TopicPartition

from backbone.handlers import Tracked
from backbone.replay.model import FRESH_STAGE, Observer, Projection, copy_text
from backbone.replay.reading import Poll, archived_poll, poll_and_stage

# How long a thread keeps the interpreter lock while another waits for it, during a replay (Python's
# default: 5 ms). At 5 ms the writer, woken by PostgreSQL's answer, waited for the stager's turn to end
# at each of a poll's round trips: 12 200-12 600 events/s in ``niuniu-audit bench-replay``, 15 100-15 500
# at 1 ms (and no better at 0.5 or 0.2 ms).
REPLAY_SWITCH_INTERVAL_S = 0.001

REPLAY_STAGE = (
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


quick_switch = _QuickSwitch()


async def apply_archived(
    conn: psycopg.AsyncConnection,
    projection: Projection,
    batches: Iterable[Sequence[Tracked]],
    observe: Observer | None,
) -> tuple[int, int]:
    """Write the archive's batches in order, as polls; (events read, events new)."""
    read = applied = 0
    source = iter(batches)

    def next_poll() -> Poll | None:
        batch = next(source, None)
        return None if batch is None else archived_poll(projection, batch, observe)

    while (poll := await asyncio.to_thread(next_poll)) is not None:
        read += len(poll.polled)
        async with conn.transaction():
            applied += await _apply(conn, projection, poll)
    return read, applied


async def drain(
    first: Poll,
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
    poll: Poll | None = first
    while poll is not None:
        # The next poll is read and staged while this one is written.
        upcoming = (
            None
            if poll.done
            else asyncio.ensure_future(
                asyncio.to_thread(poll_and_stage, consumer, projection, end, remaining, None, observe)
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


async def _apply(conn: psycopg.AsyncConnection, projection: Projection, poll: Poll) -> int:
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


async def _apply_carefully(conn: psycopg.AsyncConnection, projection: Projection, poll: Poll) -> int:
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
    conn: psycopg.AsyncConnection, projection: Projection, poll: Poll, stale: frozenset[int], *, careful: bool = False
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
