"""Group commit: concurrent calls of one operation worked on together, one transaction per group.

``Grouped(work, ...)`` is called like the operation itself (``await grouped(request)``).
A call made while no group is being worked on starts one on the loop's next turn, with
every other call made in the same turn (alone, when nothing else is waiting: no added
latency); calls made while a group is busy wait and go together in the next group, up
to ``max_group`` of them. A further group overlaps the busy ones (up to ``max_in_flight``)
only once ``overlap_at`` calls wait: a call or two arriving at a calm rate wait for the
running group and share the next instead of paying a transaction each, while a backlog
still has more than one group at work. So a group's fixed costs (a transaction, its
commit, the statements it shares) are paid once for many calls, and without load nothing
changes.

``work(requests)`` returns one outcome per request, in order: its result, or the
exception that request alone raises (a refusal). Two requests that share one of their
``keys`` (an id, say) never go in one group: the later one waits for a later group,
so a group's requests never depend on each other. When ``work`` raises for a whole group,
each of its requests is worked on again alone, so one bad request cannot fail the others.

``many(requests)`` makes several calls at once (a caller's own batch): they are queued together,
so they go in as few groups as their keys allow, and each has its own outcome.

Bounded: at most ``max_waiting`` calls wait; one more is refused with ``busy()``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

Req = TypeVar("Req")
Res = TypeVar("Res")

# Calls waiting before a group starts beside a busy one: a lone call (or two) at a calm rate waits for the
# running group instead of paying a transaction of its own.
OVERLAP_AT = 4

Work = Callable[[list[Req]], Awaitable[Sequence[Res | BaseException]]]

log = logging.getLogger(__name__)


class Grouped(Generic[Req, Res]):
    def __init__(
        self,
        work: Work[Req, Res],
        *,
        keys: Callable[[Req], Iterable[Hashable]],
        busy: Callable[[], BaseException],
        max_group: int = 64,
        max_in_flight: int = 2,
        max_waiting: int = 1024,
        overlap_at: int = OVERLAP_AT,
        on_group: Callable[[int], None] | None = None,
    ) -> None:
        if not (1 <= max_group <= max_waiting and max_in_flight >= 1 and overlap_at >= 1):
            raise ValueError("need 1 <= max_group <= max_waiting, max_in_flight >= 1 and overlap_at >= 1")
        self._work = work
        self._keys = keys
        self._busy = busy
        self._max_group = max_group
        self._max_in_flight = max_in_flight
        self._max_waiting = max_waiting
        self._overlap_at = overlap_at
        self._on_group = on_group
        self._waiting: deque[tuple[Req, asyncio.Future[Res]]] = deque()
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._starting: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def __call__(self, request: Req) -> Res:
        if len(self._waiting) >= self._max_waiting:
            raise self._busy()
        future: asyncio.Future[Res] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        self._start()
        return await future

    async def many(self, requests: Sequence[Req]) -> list[Res | BaseException]:
        """Several calls at once, queued together so that they can share a group: one outcome each, in
        order (its result, or the exception it alone raises; ``busy()`` for those past ``max_waiting``)."""
        loop = asyncio.get_running_loop()
        queued: list[asyncio.Future[Res] | BaseException] = []
        for request in requests:
            if len(self._waiting) >= self._max_waiting:
                queued.append(self._busy())
                continue
            future: asyncio.Future[Res] = loop.create_future()
            self._waiting.append((request, future))
            queued.append(future)
        self._start()
        outcomes: list[Res | BaseException] = []
        try:
            for item in queued:
                if isinstance(item, BaseException):
                    outcomes.append(item)
                    continue
                try:
                    outcomes.append(await item)
                except Exception as error:  # its refusal is its outcome
                    outcomes.append(error)
        finally:  # the caller is gone (cancelled): the calls not yet worked on are dropped
            for item in queued:
                if isinstance(item, asyncio.Future):
                    item.cancel()
        return outcomes

    def _start(self) -> None:
        """Start a group if calls wait, a group may start and none is about to: a group takes its calls
        when its task first runs, so every call made in the same turn of the loop goes in it (a burst of
        callers woken together: one group, not one alone and the rest after it). While groups are busy,
        another starts only when ``overlap_at`` calls wait."""
        if not self._waiting or self._starting is not None or self._in_flight >= self._max_in_flight:
            return
        if self._in_flight == 0 or len(self._waiting) >= self._overlap_at:
            self._in_flight += 1
            task = self._starting = asyncio.create_task(self._run())
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._starting is task:  # cancelled before it took its group (shutting down): so are the calls
            self._starting = None
            self._in_flight -= 1
            for _, future in self._waiting:
                future.cancel()
            self._waiting.clear()

    def _take(self) -> list[tuple[Req, asyncio.Future[Res]]]:
        """The next group: waiting calls in arrival order, none sharing a key with an earlier one in it."""
        group: list[tuple[Req, asyncio.Future[Res]]] = []
        later: deque[tuple[Req, asyncio.Future[Res]]] = deque()
        taken: set[Hashable] = set()
        for item in self._waiting:
            if item[1].done():  # the caller is gone (cancelled): nothing to do for it
                continue
            keys = set(self._keys(item[0]))
            if len(group) < self._max_group and not keys & taken:
                group.append(item)
                taken |= keys
            else:
                later.append(item)
        self._waiting = later
        return group

    async def _run(self) -> None:
        self._starting = None
        group = self._take()
        if not group:  # every call waiting was cancelled
            self._in_flight -= 1
            return
        self._start()  # the calls this group left (past max_group, or sharing a key) may start the next
        try:
            if self._on_group is not None:
                self._on_group(len(group))
            outcomes = await self._outcomes([request for request, _ in group])
            for (_, future), outcome in zip(group, outcomes, strict=True):
                if future.done():
                    continue
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
        except BaseException:  # cancelled (shutting down): so are the calls waiting for this group
            for _, future in group:
                future.cancel()
            raise
        finally:
            self._in_flight -= 1
            self._start()

    async def _outcomes(self, requests: list[Req]) -> list[Res | BaseException]:
        try:
            outcomes = list(await self._work(requests))
        except Exception as error:
            if len(requests) == 1:
                return [error]
            # Which request made the group fail is unknown: each alone, so only that one fails. Logged: a
            # group that fails every time costs a transaction per request and looks like no error at all.
            log.warning(
                "a group failed; each of its requests is worked on alone",
                extra={
                    "work": getattr(self._work, "__qualname__", ""),
                    "size": len(requests),
                    "error": repr(error)[:300],
                },
            )
            return [(await self._outcomes([request]))[0] for request in requests]
        if len(outcomes) != len(requests):
            raise AssertionError(f"work answered {len(outcomes)} outcomes for {len(requests)} requests")
        return outcomes
