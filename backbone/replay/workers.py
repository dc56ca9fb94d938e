"""A replay by worker processes, each replaying a share of the partitions into the one scratch schema.

It divides the partitions among them (about as many records each) and
each writes its partitions' events into the one scratch schema, made and finished (the deferred indexes
and constraints) by the calling process. Nothing a poll writes depends on another partition's events
having been written first: an event and its copies share a key, so a partition; the entries' and
rounds' keys come from the events, ``seq`` (the one value that follows the order of writing) is
compared by nobody, and balances are sums. Two polls of different workers that touch one balance row
wait for each other's commit (the upserts lock rows in one order, so they cannot deadlock). An entry id
journaled from events of two partitions is one event's entry and the other's reject, whichever comes
first, as between the polls of a single reader (and between the live consumer's partitions).

The workers are forked by a server process (multiprocessing's ``forkserver``) that imported the replay's
and the projection's code once (``ready_workers``): a worker does not import them again under its quota
(0.4 s of CPU, 1.3 s of wall time at 0.3 of a core, as long with one worker as with three).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import sys
import time
import types
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import psycopg
from kafka import TopicPartition

from backbone.cpuquota import CpuGroups
from backbone.db import run_ddl
from backbone.replay.model import Archived, Observer, Projection, ReplayReport
from backbone.replay.reading import end_offsets, observe_all, open_partitions, replay_consumer
from backbone.replay.scratch import build_deferred, plain_indexes, scratch_schema, use_scratch
from backbone.replay.writing import REPLAY_STAGE, apply_archived, drain, quick_switch

MAX_REPLAY_WORKERS = 64
# How often a replay by worker processes looks at them (their progress, an early failure).
WORKER_WATCH_S = 0.5
# The CPU cgroup under which a replay's workers get their quota (``cpu_per_worker``).
WORKER_QUOTA_PARENT = "niuniu-replay"


class ReplayWorkerFailed(RuntimeError):
    """A worker process of a replay failed; the replay is not complete."""


@dataclass(frozen=True, slots=True)
class Options:
    progress: Callable[[int, int], None] | None
    indexes: bool
    observe: Observer | None
    archived: Archived | None = None


async def replay_workers(
    dsn: str,
    bootstrap_servers: str,
    topics: Sequence[str],
    projection: Projection,
    schema: str,
    options: Options,
    workers: int,
    cpu_per_worker: float,
) -> ReplayReport:
    """``replay`` by ``workers`` processes; ``options.observe`` is shown every record by a reader of this
    process, alongside (all partitions, one poll at a time, as a replay in one process reads them)."""
    if not 1 <= workers <= MAX_REPLAY_WORKERS:
        raise ValueError(f"workers must be 1..{MAX_REPLAY_WORKERS}, not {workers}")
    started = time.perf_counter()
    ready_workers(projection)  # its imports overlap with what follows
    consumer = replay_consumer(bootstrap_servers, f"replay-{projection.name}")
    watching: asyncio.Future[None] | None = None
    try:
        end = await asyncio.to_thread(end_offsets, consumer, topics)
        starts = dict(options.archived.starts) if options.archived is not None else {}
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            put_back = await scratch_schema(conn, schema, projection)
            first_read = first_applied = 0
            if options.archived is not None:  # the archive first, in this process
                await run_ddl(conn, [*REPLAY_STAGE, *projection.stage_ddl])
                first_read, first_applied = await apply_archived(
                    conn, projection, options.archived.batches, options.observe
                )
            if options.observe is not None:
                watching = asyncio.ensure_future(
                    asyncio.to_thread(
                        observe_all,
                        consumer,
                        dataclasses.replace(projection, stager=None),
                        end,
                        options.observe,
                        starts,
                    )
                )
            shares = divide({tp: n - starts.get(tp, 0) for tp, n in end.items()}, workers)
            run = _WorkerRun(dsn, bootstrap_servers, schema, projection, shares, end, starts)
            with contextlib.ExitStack() as running:  # the workers' exits are waited for at the end
                read, applied = await run.until_done(running, cpu_per_worker, options.progress)
                read, applied = read + first_read, applied + first_applied
                if watching is not None:
                    await watching
                later = plain_indexes(projection) if options.indexes else []
                await build_deferred(dsn, conn, schema, later, put_back)
    finally:
        if watching is not None:
            await asyncio.gather(watching, return_exceptions=True)  # the consumer is closed next
        consumer.close()
    return ReplayReport(schema, read, applied, time.perf_counter() - started)


def ready_workers(projection: Projection) -> multiprocessing.context.ForkServerContext:
    """The context the workers start from: a server process, started here if it is not running, that has
    imported this module and ``projection``'s (a fresh interpreter: no thread or event loop of this
    process inherited). Its modules are fixed by its first start: later projections' are imported by
    their workers."""
    context = multiprocessing.get_context("forkserver")
    parts = (projection.handler, projection.batch_handler, projection.stager)
    context.set_forkserver_preload(sorted({__name__, *(getattr(part, "__module__", __name__) for part in parts)}))
    multiprocessing.forkserver.ensure_running()
    return context


def divide(end: Mapping[TopicPartition, int], workers: int) -> list[list[TopicPartition]]:
    """The partitions with records, in up to ``workers`` shares of about as many records each.

    The largest first, each to the share with the fewest records so far; then, pair of shares by pair,
    one partition moved or two swapped while that brings the larger of the two down (each such step
    evens the pair out, so the steps end). The largest-first pass alone left 75 296, 67 382 and
    57 323 of ``niuniu-audit bench-replay``'s 200 001 records to 3 workers (the largest share took 19.7 s,
    the smallest 16.5); the pairs bring them to 66 749, 67 559 and 65 693."""
    shares: list[list[TopicPartition]] = [[] for _ in range(workers)]
    sizes = [0] * workers
    for tp in sorted((tp for tp, n in end.items() if n > 0), key=lambda tp: (-end[tp], tp.topic, tp.partition)):
        smallest = sizes.index(min(sizes))
        shares[smallest].append(tp)
        sizes[smallest] += end[tp]
    evened = True
    while evened:
        evened = False
        for first, second in itertools.combinations(shares, 2):
            evened = _even_out(first, second, end) or evened
    return [share for share in shares if share]


def _even_out(first: list[TopicPartition], second: list[TopicPartition], end: Mapping[TopicPartition, int]) -> bool:
    """Move a partition from one share to the other, or swap one of each, whichever brings the larger share of
    the two down the most; False when none does."""
    size_first, size_second = sum(end[tp] for tp in first), sum(end[tp] for tp in second)
    best, step = max(size_first, size_second), None
    for out in [*first, None]:
        for back in [*second, None]:
            moved = (end[out] if out else 0) - (end[back] if back else 0)
            larger = max(size_first - moved, size_second + moved)
            if larger < best:
                best, step = larger, (out, back)
    if step is None:
        return False
    out, back = step
    if out is not None:
        first.remove(out)
        second.append(out)
    if back is not None:
        second.remove(back)
        first.append(back)
    return True


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

    async def until_done(
        self, stack: contextlib.ExitStack, cpu_per_worker: float, progress: Callable[[int, int], None] | None
    ) -> tuple[int, int]:
        """Start the workers (each in a CPU group of its own with ``cpu_per_worker`` > 0), report their
        progress until each has reported its end; (events read, events new), or ``ReplayWorkerFailed``.

        The workers are waited for (and the groups removed) when ``stack`` closes: a worker's exit after its
        report (the interpreter's teardown) overlaps with what the caller does next."""
        context = ready_workers(self.projection)
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
        groups = stack.enter_context(CpuGroups(WORKER_QUOTA_PARENT)) if cpu_per_worker else None
        reports: dict[int, tuple[Any, ...]] = {}
        stack.callback(_stop, procs, reports)
        tag = uuid.uuid4().hex[:6]
        for i, proc in enumerate(procs, start=1):
            with _main_left_out():
                proc.start()
            if groups is not None and proc.pid is not None:
                groups.cap(f"{tag}-worker-{i}", proc.pid, cpu_per_worker)
        total = sum(self.end.values())
        await _take_reports(
            procs, [receiver for receiver, _ in pipes], reports, lambda: _progress(progress, counters, total)
        )
        failed = [f"{procs[i].name}: {report[1]}" for i, report in sorted(reports.items()) if report[0] != "done"]
        if failed:
            raise ReplayWorkerFailed("; ".join(failed))
        if progress is not None:
            progress(sum(int(r[1]) for r in reports.values()), total)
        return sum(int(r[1]) for r in reports.values()), sum(int(r[2]) for r in reports.values())

    def _parts(self, share: list[TopicPartition]) -> list[tuple[str, int, int, int]]:
        return [(tp.topic, tp.partition, self.starts.get(tp, 0), self.end[tp]) for tp in share]


@contextlib.contextmanager
def _main_left_out() -> Iterator[None]:
    """While a worker is started: a blank main module, so that the worker does not import this process's
    again (a forked worker prepares itself as a ``spawn``ed one does, for what its arguments may name there;
    a worker's name nothing of it): ``niuniu-audit``'s, the whole command line, took 0.3 s of CPU, 1 s at 0.3
    of a core, and a worker runs none of it."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _progress(progress: Callable[[int, int], None] | None, counters: Sequence[Any], total: int) -> None:
    if progress is not None:
        progress(sum(int(c.value) for c in counters), total)


async def _take_reports(
    procs: Sequence[Any],
    receivers: Sequence[Connection],
    reports: dict[int, tuple[Any, ...]],
    watch: Callable[[], None],
) -> None:
    """Each worker's report into ``reports`` (by index) as soon as it is sent, or ("error", ...) for a worker
    that ended without one; ``watch`` called every ``WORKER_WATCH_S`` meanwhile. Stops at the first failure."""
    while len(reports) < len(procs) and all(r[0] == "done" for r in reports.values()):
        watch()
        waiting = [i for i in range(len(procs)) if i not in reports]
        await asyncio.to_thread(
            multiprocessing.connection.wait,
            [receivers[i] for i in waiting] + [procs[i].sentinel for i in waiting],
            WORKER_WATCH_S,
        )
        for i in waiting:
            if receivers[i].poll():
                reports[i] = receivers[i].recv()
            elif procs[i].exitcode is not None:  # ended without a report (killed, or it could not send one)
                reports[i] = ("error", f"exit {procs[i].exitcode}")


def _stop(procs: Sequence[Any], reports: Mapping[int, tuple[Any, ...]]) -> None:
    """End the workers still running that have not reported (after a failure of another, or of the caller),
    and wait for each (those that reported are ending by themselves)."""
    for i, proc in enumerate(procs):
        if i not in reports and proc.exitcode is None and proc.pid is not None:
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
        asyncio.to_thread(open_partitions, consumer, list(ends), projection, None, ends, starts)
    )
    quick_switch.enter()

    def count(read: int, _total: int) -> None:
        counter.value = read

    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await use_scratch(conn, schema)
            await run_ddl(conn, [*REPLAY_STAGE, *projection.stage_ddl])
            end, remaining, first = await opening
            return (0, 0) if first is None else await drain(first, consumer, conn, projection, end, remaining, count)
    finally:
        await asyncio.gather(opening, return_exceptions=True)
        quick_switch.leave()
        consumer.close()
