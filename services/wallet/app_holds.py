"""The wallet application's holds: placed in groups, resized, posted, voided and expired by the sweeper."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

import psycopg

from backbone.errors import DomainError, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from backbone.grouping import Grouped
from services.wallet import (
    domain,
    domain_holds,
    domain_play,
    events,
    metrics,
    repo,
    repo_holds,
    repo_play,
    repo_settlement,
)
from services.wallet.app_base import AppBase
from services.wallet.domain_holds import Decision, Hold, HoldRequest, ResizeRequest
from services.wallet.domain_play import Exclusion, ResponsiblePlay

SWEEP_BATCH = 200
"""Bound on holds one sweep expires (the next sweep takes the rest)."""
MAX_HOLD_GROUP = 64
"""Bound on the holds placed in one transaction."""
HOLD_GROUPS_IN_FLIGHT = 2
"""Groups of holds worked on at once (each on its own connection). A group waiting on an account's
row lock (a settlement of that player's round at another table) holds up the holds behind it until
another group is free: more groups in flight, fewer holds per transaction."""
MAX_HOLDS_PER_CALL = 64
"""Bound on the holds of one PlaceHolds call."""
MAX_HOLDS_WAITING = 1024
"""Bound on PlaceHold calls waiting for a group; one more is refused UNAVAILABLE WALLET_BUSY."""
MAX_HOLD_READS = 1000
"""Bound on the hold ids of one GetHolds call."""


def _malformed(request: HoldRequest) -> DomainError | None:
    """What is wrong with a hold request on its own, before any state (None: nothing)."""
    try:
        domain_holds.check_hold_request(request)
    except DomainError as refused:
        return refused
    return None


class Holds(AppBase):
    """Holds placed (grouped into shared transactions), resized, posted, voided and expired."""

    _hold_groups: Grouped[HoldRequest, Decision]

    def _group_holds(self) -> Grouped[HoldRequest, Decision]:
        """The groups ``place_holds`` queues holds into (``WalletApp`` keeps one, as ``_hold_groups``)."""
        return Grouped(
            self._place_holds,
            keys=lambda r: (r.hold_id,),
            busy=lambda: Unavailable("WALLET_BUSY", "too many holds waiting to be placed; retry shortly"),
            max_group=MAX_HOLD_GROUP,
            max_in_flight=HOLD_GROUPS_IN_FLIGHT,
            max_waiting=MAX_HOLDS_WAITING,
            on_group=metrics.HOLD_GROUP_SIZE.observe,
        )

    async def place_hold(self, request: HoldRequest) -> Decision:
        """Place a hold: ``place_holds`` of one, its refusal raised."""
        (outcome,) = await self.place_holds([request])
        if isinstance(outcome, DomainError):
            raise outcome
        return outcome

    async def place_holds(self, requests: Sequence[HoldRequest]) -> list[Decision | DomainError]:
        """Holds asked in one call, each decided alone with an outcome of its own (a ``DomainError`` for a
        refused one). Concurrent holds are grouped (``_hold_groups``): one transaction, one commit, and
        the same statements for a group of holds as for one; a call's holds are queued together, so
        they go in one group (two with the same hold id never share one)."""
        if not 1 <= len(requests) <= MAX_HOLDS_PER_CALL:
            raise InvalidArgument("HOLDS_COUNT", f"ask for 1 to {MAX_HOLDS_PER_CALL} holds in one call")
        malformed = {i: error for i, request in enumerate(requests) if (error := _malformed(request)) is not None}
        decided = iter(await self._hold_groups.many([r for i, r in enumerate(requests) if i not in malformed]))
        outcomes: list[Decision | DomainError] = []
        for outcome in (malformed[i] if i in malformed else next(decided) for i in range(len(requests))):
            if isinstance(outcome, DomainError):
                metrics.HOLDS_REFUSED.labels(outcome.reason).inc()
            elif isinstance(outcome, BaseException):
                raise outcome  # not a refusal: the call fails as a whole
            elif not outcome.replayed:
                metrics.HOLDS_PLACED.inc()
                metrics.HOLDS_OPEN.inc()
            outcomes.append(outcome)
        return outcomes

    async def _place_holds(self, requests: list[HoldRequest]) -> list[Decision | BaseException]:
        """Decide and save a group of holds (distinct hold ids) in one transaction.

        Two round trips (pipeline mode): the accounts locked with the hold ids' earlier uses and
        the accounts' settings; then the holds, their movements, their events and the COMMIT. The
        losses of a window are read (one more each) only for accounts with a loss limit in force.
        A hold refused is an outcome of its own: it writes nothing and the others go on. An account's
        holds are decided in the group's order, each on the balance the ones before it left (its
        available and held minor, and so its loss limit), and its events take consecutive versions.
        """

        async def work(conn: psycopg.AsyncConnection) -> list[Decision | BaseException]:
            loaded = await repo_holds.hold_contexts(
                conn, [r.account for r in requests], [r.hold_id for r in requests], [r.round_id for r in requests]
            )
            now = self.clock()
            outcomes: list[Decision | BaseException] = []
            for request in requests:
                try:
                    outcomes.append(await self._decide_hold(conn, request, loaded, now))
                except DomainError as refused:
                    outcomes.append(refused)
            placed = [d for d in outcomes if isinstance(d, Decision) and not d.replayed]
            if not placed:
                return outcomes
            await repo_holds.insert_holds(conn, [d.hold for d in placed])
            versions: dict[str, int] = {}
            for decision in placed:
                account = decision.hold.account
                version = versions.get(account, loaded.accounts[account].version)
                placed_event = events.hold_placed(decision.hold, decision.movements[0])
                await self._store.append_queued(conn, events.account_stream(account), version, [placed_event])
                versions[account] = version + 1
            # The balances, their entries and the accounts' new stream versions: one statement.
            await repo.save_movements(conn, [m for d in placed for m in d.movements], "hold", now, versions)
            return outcomes

        return await self._pipelined(work)

    async def _decide_hold(
        self, conn: psycopg.AsyncConnection, request: HoldRequest, loaded: repo_holds.HoldContexts, now: datetime
    ) -> Decision:
        target, existing = loaded.accounts.get(request.account), loaded.existing.get(request.hold_id)
        if target is None:
            raise NotFound("ACCOUNT_NOT_FOUND", f"no account {request.account}")
        if existing is None and request.round_id in loaded.ended_rounds:
            # Its settlement is applied: nothing could post this hold or release it but the sweeper.
            raise FailedPrecondition("ROUND_ENDED", f"round {request.round_id} is already settled")
        play = ResponsiblePlay()
        if existing is None:
            play = ResponsiblePlay(
                loaded.limits.get(request.account, {}), loaded.exclusions.get(request.account, Exclusion())
            )
            if domain_play.loss_limit_in_force(play, now):
                used = await repo_play.window_sums(conn, request.account, now)
                play = ResponsiblePlay(play.limits, play.exclusion, used)
        decision = domain_holds.decide_place_hold(request, existing, target.state, play, now)
        if not decision.replayed:  # the account's next hold in the group is decided on what this one leaves
            after = domain.apply_movements({request.account: target.state}, decision.movements)
            loaded.accounts[request.account] = replace(target, state=after[request.account])
        return decision

    async def resize_hold(self, request: ResizeRequest) -> Decision:
        domain_holds.check_resize_request(request)

        async def work(conn: psycopg.AsyncConnection) -> Decision:
            found = await repo_holds.hold(conn, request.hold_id)
            if found is None:
                raise NotFound("HOLD_NOT_FOUND", f"no hold {request.hold_id}")
            locked = await self._lock(conn, [found.account])
            target = locked[found.account]
            hold = await repo_holds.hold(conn, request.hold_id, lock=True)
            assert hold is not None
            existing = await repo_holds.hold_resize(conn, request.resize_id)
            now = self.clock()
            play = ResponsiblePlay() if existing else await self._play(conn, hold.account, now)
            decision = domain_holds.decide_resize(request, existing, hold, target.state, play, now)
            if decision.replayed:
                return decision
            assert decision.resize is not None
            domain.apply_movements({hold.account: target.state}, decision.movements)
            await repo_holds.save_resize(conn, decision.hold, decision.resize)
            await repo.save_movements(conn, decision.movements, "resize", now)
            event = events.hold_resized(decision.hold, decision.resize, decision.movements)
            await self._append_account(conn, target, [event])
            return decision

        decision = await self._transaction(work)
        if decision.resize is not None:
            change = decision.resize.request.amount_minor - decision.resize.previous_minor
            metrics.HOLDS_RESIZED.labels("up" if change > 0 else "down" if change < 0 else "same").inc()
        return decision

    async def post_hold(self, hold_id: str, postings: list[tuple[str, int]]) -> Decision:
        domain.check_id(hold_id, "HOLD_ID")
        domain_holds.check_postings("", postings)
        return await self._resolve(
            hold_id, [p for p, _ in postings], lambda h, now: self._decide_post(h, postings, now)
        )

    @staticmethod
    def _decide_post(hold: Hold, postings: list[tuple[str, int]], now: datetime) -> Decision:
        return domain_holds.decide_post(hold, domain_holds.check_postings(hold.account, postings), now)

    async def void_hold(self, hold_id: str) -> Decision:
        domain.check_id(hold_id, "HOLD_ID")
        return await self._resolve(hold_id, [], domain_holds.decide_void)

    async def _resolve(self, hold_id: str, payees: list[str], decide: Callable[[Hold, datetime], Decision]) -> Decision:
        async def work(conn: psycopg.AsyncConnection) -> Decision:
            found = await repo_holds.hold(conn, hold_id)
            if found is None:
                raise NotFound("HOLD_NOT_FOUND", f"no hold {hold_id}")
            locked = await self._lock(conn, [found.account, *payees])
            hold = await repo_holds.hold(conn, hold_id, lock=True)
            assert hold is not None
            now = self.clock()
            decision = decide(hold, now)
            if not decision.replayed:
                await self._save_resolution(conn, locked, decision, now)
            return decision

        decision = await self._transaction(work)
        if not decision.replayed:
            self._count_resolution(decision.hold)
        return decision

    async def _save_resolution(
        self, conn: psycopg.AsyncConnection, locked: dict[str, repo.LockedAccount], decision: Decision, now: datetime
    ) -> None:
        hold = decision.hold
        domain.apply_movements({n: a.state for n, a in locked.items()}, decision.movements)
        await repo_holds.save_resolutions(conn, [hold])
        await repo.save_movements(conn, decision.movements, hold.resolved_by, now)
        await self._append_account(conn, locked[hold.account], [events.hold_resolved(hold, decision.movements)])

    @staticmethod
    def _count_resolution(hold: Hold) -> None:
        counter = {
            domain.HoldStatus.POSTED: metrics.HOLDS_POSTED,
            domain.HoldStatus.VOIDED: metrics.HOLDS_VOIDED,
            domain.HoldStatus.EXPIRED: metrics.HOLDS_EXPIRED,
        }[hold.status]
        counter.inc()
        metrics.HOLDS_OPEN.dec()
        if hold.resolved_at is not None:
            metrics.HOLD_AGE_SECONDS.observe(max(0.0, (hold.resolved_at - hold.placed_at).total_seconds()))

    async def expire_due(self) -> int:
        """Expire open holds past their time (bounded batch); safe to run on every replica at once."""
        now = self.clock()
        async with self._pool.connection() as conn:
            due = await repo_holds.due_holds(conn, now, SWEEP_BATCH)
        expired = 0
        for hold_id, account in due:

            async def work(
                conn: psycopg.AsyncConnection, hold_id: str = hold_id, account: str = account
            ) -> Hold | None:
                locked = await self._lock(conn, [account])
                hold = await repo_holds.hold(conn, hold_id, lock=True)
                decision = domain_holds.decide_expire(hold, now) if hold is not None else None
                if decision is None:
                    return None  # resolved meanwhile (or by another replica)
                await self._save_resolution(conn, locked, decision, now)
                return decision.hold

            resolved = await self._transaction(work)
            if resolved is not None:
                self._count_resolution(resolved)
                expired += 1
        return expired

    async def refresh_hold_gauges(self) -> None:
        """The open holds' gauges, and the rounds still rejected (the latch of the settlement alert)."""
        async with self._pool.connection() as conn:
            count, oldest = await repo_holds.open_hold_stats(conn)
            rejected = await repo_settlement.rejected_round_count(conn)
        metrics.ROUNDS_REJECTED.set(rejected)
        metrics.HOLDS_OPEN.set(count)
        age = (self.clock() - oldest).total_seconds() if oldest is not None else 0.0
        metrics.OLDEST_OPEN_HOLD_SECONDS.set(max(0.0, age))

    async def hold(self, hold_id: str) -> Hold:
        domain.check_id(hold_id, "HOLD_ID")
        async with self._pool.connection() as conn:
            found = await repo_holds.hold(conn, hold_id)
        if found is None:
            raise NotFound("HOLD_NOT_FOUND", f"no hold {hold_id}")
        return found

    async def holds_by_id(self, hold_ids: Sequence[str]) -> list[Hold]:
        """The holds found of ``hold_ids`` (at most ``MAX_HOLD_READS``, each checked before anything is
        read), in one statement; an unknown id is left out."""
        if len(hold_ids) > MAX_HOLD_READS:
            raise InvalidArgument("HOLD_IDS_COUNT", f"ask for at most {MAX_HOLD_READS} holds in one call")
        for hold_id in hold_ids:
            domain.check_id(hold_id, "HOLD_ID")
        if not hold_ids:
            return []
        async with self._pool.connection() as conn:
            found = await repo_holds.holds(conn, hold_ids)
        return list(found.values())
