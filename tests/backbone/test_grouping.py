"""Group commit (``backbone.grouping.Grouped``): pure, no infrastructure."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from backbone.grouping import Grouped


class Refused(Exception):
    pass


class Busy(Exception):
    pass


class Recorder:
    """A ``work`` that records its groups and answers each request doubled (or refuses odd ones)."""

    def __init__(self, *, refuse_odd: bool = False, fail_with: int | None = None) -> None:
        self.groups: list[list[int]] = []
        self.release = asyncio.Event()
        self.release.set()
        self._refuse_odd = refuse_odd
        self._fail_with = fail_with

    async def __call__(self, requests: list[int]) -> Sequence[int | BaseException]:
        self.groups.append(list(requests))
        await self.release.wait()
        if self._fail_with is not None and self._fail_with in requests:
            raise RuntimeError("the whole group failed")
        return [Refused(r) if self._refuse_odd and r % 2 else 2 * r for r in requests]


def grouped(
    work: Recorder, *, max_group: int = 64, max_in_flight: int = 2, max_waiting: int = 1024, overlap_at: int = 1
) -> Grouped[int, int]:
    return Grouped(
        work,
        keys=lambda r: (r % 100,),
        busy=lambda: Busy(),
        max_group=max_group,
        max_in_flight=max_in_flight,
        max_waiting=max_waiting,
        overlap_at=overlap_at,
    )


async def one_group_held(work: Recorder, first: int, **bounds: int) -> tuple[Grouped[int, int], asyncio.Future[int]]:
    """``grouped(work)`` one group at a time, its first call (``first``) being worked on and held until
    ``work.release`` is set: the calls made next wait for the group after it."""
    work.release.clear()
    calls = grouped(work, max_in_flight=1, **bounds)
    started = asyncio.ensure_future(calls(first))
    await asyncio.sleep(0)
    return calls, started


async def test_calls_made_while_a_group_is_worked_on_go_together_in_the_next() -> None:
    work = Recorder()
    calls, first = await one_group_held(work, 1)
    rest = [asyncio.ensure_future(calls(r)) for r in range(2, 12)]
    await asyncio.sleep(0)
    work.release.set()
    assert await first == 2
    assert await asyncio.gather(*rest) == [2 * r for r in range(2, 12)]
    assert work.groups == [[1], list(range(2, 12))]


async def test_calls_made_in_the_same_turn_of_the_loop_go_in_one_group() -> None:
    """Callers woken together (the bets of one read group going on to their holds) make one group, not
    one group alone and the rest in the next."""
    work = Recorder()
    calls = grouped(work, max_in_flight=2)
    assert await asyncio.gather(*(calls(r) for r in range(1, 6))) == [2, 4, 6, 8, 10]
    assert work.groups == [[1, 2, 3, 4, 5]]


async def test_a_lone_call_is_worked_on_at_once_and_groups_are_bounded() -> None:
    work = Recorder()
    calls = grouped(work, max_in_flight=1, max_group=4)
    assert await calls(7) == 14
    assert work.groups == [[7]]
    work.groups.clear()
    work.release.clear()
    started = asyncio.ensure_future(calls(0))
    await asyncio.sleep(0)
    waiting = [asyncio.ensure_future(calls(r)) for r in range(1, 10)]
    await asyncio.sleep(0)
    work.release.set()
    await asyncio.gather(started, *waiting)
    assert work.groups == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9]]


async def test_a_few_calls_wait_for_the_busy_group_and_a_backlog_overlaps_it() -> None:
    """At a calm rate a call or two arriving while a group is worked on wait for it and share the next
    group (not a transaction each); once ``overlap_at`` calls wait, a second group starts beside it."""
    work = Recorder()
    work.release.clear()
    calls = grouped(work, max_in_flight=2, overlap_at=3)
    first = asyncio.ensure_future(calls(1))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(calls(2))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert work.groups == [[1]]  # one call waiting: below overlap_at, no second group
    backlog = [asyncio.ensure_future(calls(r)) for r in (3, 4)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert work.groups == [[1], [2, 3, 4]]  # three waiting: a second group overlaps the first
    work.release.set()
    assert await asyncio.gather(first, second, *backlog) == [2, 4, 6, 8]


async def test_requests_sharing_a_key_never_share_a_group() -> None:
    work = Recorder()
    calls, first = await one_group_held(work, 5)
    rest = [asyncio.ensure_future(calls(r)) for r in (1, 101, 2, 201, 102)]
    await asyncio.sleep(0)
    work.release.set()
    await asyncio.gather(first, *rest)
    assert work.groups == [[5], [1, 2], [101, 102], [201]]  # arrival order kept within each key


async def test_a_refusal_reaches_its_caller_only() -> None:
    work = Recorder(refuse_odd=True)
    calls, first = await one_group_held(work, 2)
    rest = [asyncio.ensure_future(calls(r)) for r in (3, 4, 5, 6)]
    await asyncio.sleep(0)
    work.release.set()
    outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
    assert outcomes[0] == 4 and outcomes[2] == 8 and outcomes[4] == 12
    assert isinstance(outcomes[1], Refused) and isinstance(outcomes[3], Refused)


async def test_a_group_that_fails_is_worked_on_again_one_by_one(caplog: pytest.LogCaptureFixture) -> None:
    work = Recorder(fail_with=13)
    calls, first = await one_group_held(work, 1)
    rest = [asyncio.ensure_future(calls(r)) for r in (12, 13, 14)]
    await asyncio.sleep(0)
    work.release.set()
    with caplog.at_level(logging.WARNING, logger="backbone.grouping"):
        outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
    assert outcomes[0] == 2 and outcomes[1] == 24 and outcomes[3] == 28
    assert isinstance(outcomes[2], RuntimeError)
    assert work.groups == [[1], [12, 13, 14], [12], [13], [14]]
    # The group's failure is logged once (not the lone 13's own, which is its caller's outcome).
    failed = [r for r in caplog.records if r.getMessage().startswith("a group failed")]
    assert [(r.size, "RuntimeError" in r.error) for r in failed] == [(3, True)]  # type: ignore[attr-defined]


async def test_waiting_calls_are_bounded() -> None:
    work = Recorder()
    calls, first = await one_group_held(work, 1, max_group=2, max_waiting=3)
    waiting = [asyncio.ensure_future(calls(r)) for r in (2, 3, 4)]
    await asyncio.sleep(0)
    assert calls.waiting == 3
    with pytest.raises(Busy):
        await calls(5)
    work.release.set()
    assert await asyncio.gather(first, *waiting) == [2, 4, 6, 8]


async def test_a_caller_gone_before_its_group_leaves_the_others_unharmed() -> None:
    work = Recorder()
    calls, first = await one_group_held(work, 1)
    gone = asyncio.ensure_future(calls(2))
    stays = asyncio.ensure_future(calls(3))
    await asyncio.sleep(0)
    gone.cancel()
    work.release.set()
    assert await first == 2 and await stays == 6
    assert work.groups == [[1], [3]]


async def test_many_calls_at_once_share_groups_as_their_keys_allow_each_with_its_outcome() -> None:
    work = Recorder(refuse_odd=True)
    calls = grouped(work, max_in_flight=1, max_group=4)
    outcomes = await calls.many([2, 3, 102, 4, 6, 8])
    assert outcomes[0] == 4 and outcomes[2] == 204 and outcomes[3:] == [8, 12, 16]
    assert isinstance(outcomes[1], Refused)
    assert work.groups == [[2, 3, 4, 6], [102, 8]]  # 102 shares 2's key: the next group


async def test_many_past_the_bound_are_refused_busy_and_the_rest_are_worked_on() -> None:
    work = Recorder()
    calls, first = await one_group_held(work, 1, max_group=2, max_waiting=3)
    batch = asyncio.ensure_future(calls.many([2, 3, 4, 5, 6]))
    await asyncio.sleep(0)
    work.release.set()
    outcomes = await batch
    assert outcomes[:3] == [4, 6, 8]
    assert all(isinstance(o, Busy) for o in outcomes[3:])
    assert await first == 2
    assert work.groups == [[1], [2, 3], [4]]


async def test_many_cancelled_drops_its_calls_not_yet_worked_on() -> None:
    work = Recorder()
    calls, first = await one_group_held(work, 1)
    batch = asyncio.ensure_future(calls.many([2, 3]))
    stays = asyncio.ensure_future(calls(4))
    await asyncio.sleep(0)
    batch.cancel()
    await asyncio.sleep(0)
    work.release.set()
    assert await first == 2 and await stays == 8
    assert work.groups == [[1], [4]]


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        grouped(Recorder(), max_group=0)
    with pytest.raises(ValueError):
        grouped(Recorder(), max_group=8, max_waiting=4)
    with pytest.raises(ValueError):
        grouped(Recorder(), max_in_flight=0)
    with pytest.raises(ValueError):
        grouped(Recorder(), overlap_at=0)
