"""The wallet application: load -> decide (domain) -> save state, entries and events in one transaction.

Each command runs in its own transaction (retried a bounded number of times when a
concurrent writer wins a race); the settlement runs inside the consumer's
transaction, so its effects commit together with the consumer's tracking row.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Generic, TypeVar

import jwt
import psycopg
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from psycopg_pool import AsyncConnectionPool

from backbone.auth import Role as TokenRole
from backbone.auth import Tokens
from backbone.db import sent_together
from backbone.errors import (
    Aborted,
    AlreadyExists,
    DomainError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unauthenticated,
    Unavailable,
)
from backbone.eventstore import ConcurrencyError, EventStore, NewEvent, utc_now
from backbone.grouping import Grouped
from services.wallet import domain, domain_holds, domain_play, domain_settlement, events, metrics, repo
from services.wallet.domain import CASHIER, AccountKind, AccountState
from services.wallet.domain_holds import Decision, Hold, HoldRequest, ResizeRequest
from services.wallet.domain_play import Exclusion, LimitKind, ResponsiblePlay
from services.wallet.domain_settlement import SettlementCommand, SettlementRejected

log = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], datetime]

MAX_ATTEMPTS = 8
"""Bound on retries of one command after losing a race (unique key, deadlock, serialization)."""
RETRY_BACKOFF_S = 0.005
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100
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

_RETRYABLE = (
    psycopg.errors.UniqueViolation,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
    ConcurrencyError,
)


@dataclass(frozen=True, slots=True)
class MovementResult:
    movement_id: str
    balance: AccountState
    replayed: bool


@dataclass(frozen=True, slots=True)
class LoginResult:
    token: str
    user: repo.User
    expires_at_unix_ms: int


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    next_page_token: str


def page_size(requested: int) -> int:
    if requested < 0 or requested > MAX_PAGE_SIZE:
        raise InvalidArgument("PAGE_SIZE_INVALID", f"page_size must be 0..{MAX_PAGE_SIZE}")
    return requested or DEFAULT_PAGE_SIZE


_INT_TOKEN = re.compile(r"[0-9]{1,19}")


def int_page_token(token: str) -> int:
    """Keyset paging newest first: the token is the last id seen (exclusive)."""
    if not token:
        return 2**63 - 1
    # ASCII digits only: str.isdigit() also takes '²' or '①', which int() then refuses.
    if not _INT_TOKEN.fullmatch(token) or int(token) > 2**63 - 1:
        raise InvalidArgument("PAGE_TOKEN_INVALID", "page_token must come from a previous page")
    return int(token)


def settlement_digest(command: SettlementCommand) -> str:
    return hashlib.sha256(repr(command).encode()).hexdigest()


def _malformed(request: HoldRequest) -> DomainError | None:
    """What is wrong with a hold request on its own, before any state (None: nothing)."""
    try:
        domain_holds.check_hold_request(request)
    except DomainError as refused:
        return refused
    return None


class WalletApp:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        store: EventStore,
        tokens: Tokens,
        *,
        clock: Clock = utc_now,
        hasher: PasswordHasher | None = None,
        new_id: Callable[[], uuid.UUID] = uuid.uuid4,
    ) -> None:
        self._pool = pool
        self._store = store
        self.tokens = tokens
        self.clock = clock
        self._hasher = hasher or PasswordHasher()
        self._new_id = new_id
        self._dummy_hash: str | None = None
        self._hold_groups: Grouped[HoldRequest, Decision] = Grouped(
            self._place_holds,
            keys=lambda r: (r.hold_id,),
            busy=lambda: Unavailable("WALLET_BUSY", "too many holds waiting to be placed; retry shortly"),
            max_group=MAX_HOLD_GROUP,
            max_in_flight=HOLD_GROUPS_IN_FLIGHT,
            max_waiting=MAX_HOLDS_WAITING,
            on_group=metrics.HOLD_GROUP_SIZE.observe,
        )

    async def _transaction(self, work: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                async with self._pool.connection() as conn, conn.transaction():
                    return await work(conn)
            except _RETRYABLE as error:
                if attempt == MAX_ATTEMPTS:
                    log.warning("gave up after concurrent updates", extra={"error": str(error)})
                    raise Aborted("CONCURRENT_UPDATE", "too many concurrent updates; retry with the same id") from None
                await asyncio.sleep(RETRY_BACKOFF_S * attempt)
        raise AssertionError("unreachable")

    async def _pipelined(self, work: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        """``_transaction`` in pipeline mode (``sent_together``): the BEGIN travels with the first
        statements, statements whose results ``work`` does not read travel together, and the writes
        after its last read go with the COMMIT (errors surface there and are retried like the others)."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                async with self._pool.connection() as conn:
                    async with sent_together(conn):
                        result = await work(conn)
                    return result
            except _RETRYABLE as error:
                if attempt == MAX_ATTEMPTS:
                    log.warning("gave up after concurrent updates", extra={"error": str(error)})
                    raise Aborted("CONCURRENT_UPDATE", "too many concurrent updates; retry with the same id") from None
                await asyncio.sleep(RETRY_BACKOFF_S * attempt)
        raise AssertionError("unreachable")

    async def _append_account(
        self, conn: psycopg.AsyncConnection, locked: repo.LockedAccount, new_events: list[NewEvent]
    ) -> None:
        name = locked.state.account
        await self._store.append(conn, events.account_stream(name), locked.version, new_events)
        await repo.bump_version(conn, name, locked.version + len(new_events))

    @staticmethod
    async def _lock(conn: psycopg.AsyncConnection, names: list[str]) -> dict[str, repo.LockedAccount]:
        locked = await repo.lock_accounts(conn, names)
        for name in names:
            if name not in locked:
                raise NotFound("ACCOUNT_NOT_FOUND", f"no account {name}")
        return locked

    # ----------------------------------------------------------------------- users

    async def register(self, request_id: str, username: str, email: str, password: str) -> repo.User:
        domain.check_id(request_id, "REQUEST_ID")
        domain.check_registration(username, email, password)
        password_hash = await asyncio.to_thread(self._hasher.hash, password)

        # Request ids are scoped by the username asked for: one anonymous caller reusing another's
        # id registers their own account instead of being refused (or blocked) because of it.
        scoped = f"{username}/{request_id}"

        async def work(conn: psycopg.AsyncConnection) -> repo.User:
            earlier = await repo.user_by(conn, "request_id", scoped)
            if earlier is None:  # registered before ids were scoped: its id was stored as sent
                legacy = await repo.user_by(conn, "request_id", request_id)
                earlier = legacy if legacy is not None and legacy.username == username else None
            if earlier is not None:
                same = earlier.username == username and earlier.email == email
                if same and await self._verify(earlier.password_hash, password):
                    return earlier
                raise AlreadyExists("REQUEST_ID_REUSED", f"request {request_id} registered a different account")
            return await self._create_user(conn, domain.Role.PLAYER, username, email, password_hash, scoped)

        return await self._transaction(work)

    async def create_staff(self, role: domain.Role, username: str, email: str, password: str) -> repo.User:
        """Admin, auditor and cashier accounts: only through the admin command (python -m services.wallet.admin)."""
        assert role in (domain.Role.ADMIN, domain.Role.AUDITOR, domain.Role.CASHIER)
        domain.check_registration(username, email, password)
        password_hash = await asyncio.to_thread(self._hasher.hash, password)
        return await self._transaction(lambda conn: self._create_user(conn, role, username, email, password_hash, None))

    async def reset_staff_password(self, username: str, password: str) -> repo.User:
        """A new password for an admin or auditor: only through the admin command, like create_staff."""
        async with self._pool.connection() as conn:
            user = await repo.user_by(conn, "username", username)
        if user is None or user.role == domain.Role.PLAYER.value:
            raise NotFound("STAFF_NOT_FOUND", f"no staff account named {username[:80]}")
        domain.check_registration(username, user.email, password)
        password_hash = await asyncio.to_thread(self._hasher.hash, password)
        async with self._pool.connection() as conn:
            await repo.update_password_hash(conn, user.account_id, password_hash)
        return user

    async def _create_user(
        self,
        conn: psycopg.AsyncConnection,
        role: domain.Role,
        username: str,
        email: str,
        password_hash: str,
        request_id: str | None,
    ) -> repo.User:
        if await repo.user_by(conn, "username", username) is not None:
            raise AlreadyExists("USERNAME_TAKEN", f"username {username} is taken")
        user = repo.User(str(self._new_id()), username, email, password_hash, role.value, request_id, self.clock())
        await repo.insert_user(conn, user)
        if role is domain.Role.PLAYER:
            account = domain.player_account(user.account_id)
            await repo.insert_account(conn, account, AccountKind.PLAYER)
            await self._append_account(
                conn,
                repo.LockedAccount(AccountState(account, AccountKind.PLAYER), 0),
                [events.account_opened(account, username, role.value, request_id or user.account_id)],
            )
        else:  # staff hold no money: their stream only records that they exist
            staff = f"{role.value}:{user.account_id}"
            opened = events.account_opened(staff, username, role.value, user.account_id)
            await self._store.append(conn, events.account_stream(staff), 0, [opened])
        return user

    async def _verify(self, password_hash: str, password: str) -> bool:
        try:
            return await asyncio.to_thread(self._hasher.verify, password_hash, password)
        except (VerificationError, InvalidHashError):
            return False

    async def login(self, username: str, password: str) -> LoginResult:
        # A name no account can have is not looked up (a NUL would not even reach PostgreSQL).
        if not domain.is_username(username) or not password or len(password) > domain.MAX_PASSWORD_CHARS:
            raise Unauthenticated("INVALID_CREDENTIALS", "wrong username or password")
        async with self._pool.connection() as conn:
            user = await repo.user_by(conn, "username", username)
        if user is None:
            # Spend the same time as a real check, so a wrong name cannot be told from a wrong password.
            if self._dummy_hash is None:
                self._dummy_hash = await asyncio.to_thread(self._hasher.hash, "not-a-password")
            await self._verify(self._dummy_hash, password)
            raise Unauthenticated("INVALID_CREDENTIALS", "wrong username or password")
        if not await self._verify(user.password_hash, password):
            raise Unauthenticated("INVALID_CREDENTIALS", "wrong username or password")
        if self._hasher.check_needs_rehash(user.password_hash):
            fresh = await asyncio.to_thread(self._hasher.hash, password)
            async with self._pool.connection() as conn:
                await repo.update_password_hash(conn, user.account_id, fresh)
        role = TokenRole(user.role)
        token = self.tokens.issue(user.account_id, role)
        expires_s = int(jwt.decode(token, options={"verify_signature": False})["exp"])
        return LoginResult(token, user, expires_s * 1000)

    async def user(self, account_id: str) -> repo.User:
        domain.check_uuid(account_id, "ACCOUNT_ID")
        async with self._pool.connection() as conn:
            user = await repo.user_by(conn, "account_id", account_id)
        if user is None:
            raise NotFound("ACCOUNT_NOT_FOUND", f"no account {account_id}")
        return user

    # ----------------------------------------------------------------------- cash

    async def deposit(self, actor: str, request_id: str, account: str, amount_minor: int) -> MovementResult:
        return await self._cash("deposit", actor, request_id, account, amount_minor)

    async def withdraw(self, actor: str, request_id: str, account: str, amount_minor: int) -> MovementResult:
        return await self._cash("withdrawal", actor, request_id, account, amount_minor)

    async def _cash(self, kind: str, actor: str, request_id: str, account: str, amount_minor: int) -> MovementResult:
        domain.check_id(request_id, "REQUEST_ID")
        domain.account_kind(account)
        domain.check_amount(amount_minor)
        # Request ids are scoped by the caller (the staff member's account id), so two admins
        # choosing the same id make two movements instead of one refusing the other.
        scoped = f"{actor}:{request_id}"
        key, fingerprint = f"{kind}:{scoped}", f"{account}|{amount_minor}"

        async def work(conn: psycopg.AsyncConnection) -> MovementResult:
            earlier = await repo.request(conn, key)
            if earlier is None:  # made before ids were scoped: a retry of it is still a replay
                legacy = await repo.request(conn, f"{kind}:{request_id}")
                earlier = legacy if legacy is not None and legacy.fingerprint == fingerprint else None
            if earlier is not None:
                if earlier.fingerprint != fingerprint:
                    raise AlreadyExists("REQUEST_ID_REUSED", f"{kind} {request_id} was made with other fields")
                return MovementResult(earlier.movement_id, earlier.balance, replayed=True)
            now = self.clock()
            locked = await self._lock(conn, [account, CASHIER])
            target = locked[account]
            if kind == "deposit":
                movement = domain.deposit(scoped, target.state, amount_minor)
                if target.state.kind is AccountKind.PLAYER:
                    domain_play.check_may_deposit(await self._play(conn, account, now), amount_minor, now)
                event = events.deposited(movement, actor, request_id)
            else:
                movement = domain.withdrawal(scoped, target.state, amount_minor)
                event = events.withdrawn(movement, actor, request_id)
            after = domain.apply_movements({n: a.state for n, a in locked.items()}, [movement])
            await repo.save_movements(conn, [movement], kind, now)
            await self._append_account(conn, target, [event])
            await repo.insert_request(conn, key, repo.StoredRequest(fingerprint, movement.movement_id, after[account]))
            return MovementResult(movement.movement_id, after[account], replayed=False)

        return await self._transaction(work)

    # ----------------------------------------------------------------------- holds

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
            loaded = await repo.hold_contexts(
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
            await repo.insert_holds(conn, [d.hold for d in placed])
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
        self, conn: psycopg.AsyncConnection, request: HoldRequest, loaded: repo.HoldContexts, now: datetime
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
                used = await repo.window_sums(conn, request.account, now)
                play = ResponsiblePlay(play.limits, play.exclusion, used)
        decision = domain_holds.decide_place_hold(request, existing, target.state, play, now)
        if not decision.replayed:  # the account's next hold in the group is decided on what this one leaves
            after = domain.apply_movements({request.account: target.state}, decision.movements)
            loaded.accounts[request.account] = replace(target, state=after[request.account])
        return decision

    async def resize_hold(self, request: ResizeRequest) -> Decision:
        domain_holds.check_resize_request(request)

        async def work(conn: psycopg.AsyncConnection) -> Decision:
            found = await repo.hold(conn, request.hold_id)
            if found is None:
                raise NotFound("HOLD_NOT_FOUND", f"no hold {request.hold_id}")
            locked = await self._lock(conn, [found.account])
            target = locked[found.account]
            hold = await repo.hold(conn, request.hold_id, lock=True)
            assert hold is not None
            existing = await repo.hold_resize(conn, request.resize_id)
            now = self.clock()
            play = ResponsiblePlay() if existing else await self._play(conn, hold.account, now)
            decision = domain_holds.decide_resize(request, existing, hold, target.state, play, now)
            if decision.replayed:
                return decision
            assert decision.resize is not None
            domain.apply_movements({hold.account: target.state}, decision.movements)
            await repo.save_resize(conn, decision.hold, decision.resize)
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
            found = await repo.hold(conn, hold_id)
            if found is None:
                raise NotFound("HOLD_NOT_FOUND", f"no hold {hold_id}")
            locked = await self._lock(conn, [found.account, *payees])
            hold = await repo.hold(conn, hold_id, lock=True)
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
        await repo.save_resolutions(conn, [hold])
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
            due = await repo.due_holds(conn, now, SWEEP_BATCH)
        expired = 0
        for hold_id, account in due:

            async def work(
                conn: psycopg.AsyncConnection, hold_id: str = hold_id, account: str = account
            ) -> Hold | None:
                locked = await self._lock(conn, [account])
                hold = await repo.hold(conn, hold_id, lock=True)
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
            count, oldest = await repo.open_hold_stats(conn)
            rejected = await repo.rejected_round_count(conn)
        metrics.ROUNDS_REJECTED.set(rejected)
        metrics.HOLDS_OPEN.set(count)
        age = (self.clock() - oldest).total_seconds() if oldest is not None else 0.0
        metrics.OLDEST_OPEN_HOLD_SECONDS.set(max(0.0, age))

    async def hold(self, hold_id: str) -> Hold:
        domain.check_id(hold_id, "HOLD_ID")
        async with self._pool.connection() as conn:
            found = await repo.hold(conn, hold_id)
        if found is None:
            raise NotFound("HOLD_NOT_FOUND", f"no hold {hold_id}")
        return found

    # ----------------------------------------------------------------------- queries

    async def balance(self, account: str) -> AccountState:
        domain.account_kind(account)
        async with self._pool.connection() as conn:
            found = await repo.account(conn, account)
        if found is None:
            raise NotFound("ACCOUNT_NOT_FOUND", f"no account {account}")
        return found

    async def balances(self, page_token: str, size: int) -> tuple[Page[AccountState], int]:
        """One page of every account's balance, with the event-store position it reflects."""
        limit = page_size(size)
        after = _decode_name_token(page_token)
        async with self._pool.connection() as conn, conn.transaction():
            await repo.hold_appends(conn)  # no append in flight: the page is exactly as of the position
            rows = await repo.balances_page(conn, after, limit)
            position = await repo.store_position(conn)
        token = _encode_name_token(rows[-1].account) if len(rows) == limit else ""
        return Page(rows, token), position

    async def movements(self, account: str, page_token: str, size: int) -> Page[repo.Entry]:
        await self.balance(account)
        limit, before = page_size(size), int_page_token(page_token)
        async with self._pool.connection() as conn:
            rows = await repo.entries_page(conn, account, before, limit)
        return Page(rows, str(rows[-1].entry_id) if len(rows) == limit else "")

    async def holds(self, account: str, include_resolved: bool, page_token: str, size: int) -> Page[Hold]:
        await self.balance(account)
        limit, before = page_size(size), int_page_token(page_token)
        async with self._pool.connection() as conn:
            rows = await repo.holds_page(conn, account, include_resolved, before, limit)
        return Page([h for _, h in rows], str(rows[-1][0]) if len(rows) == limit else "")

    # ----------------------------------------------------------------------- responsible play

    async def _play(self, conn: psycopg.AsyncConnection, account: str, now: datetime) -> ResponsiblePlay:
        return ResponsiblePlay(
            await repo.limits(conn, account),
            await repo.exclusion(conn, account),
            await repo.window_sums(conn, account, now),
        )

    async def responsible_play(self, account: str) -> tuple[ResponsiblePlay, datetime]:
        self._check_player(account)
        await self.balance(account)
        now = self.clock()
        async with self._pool.connection() as conn:
            return await self._play(conn, account, now), now

    @staticmethod
    def _check_player(account: str) -> None:
        if domain.account_kind(account) is not AccountKind.PLAYER:
            raise InvalidArgument("ACCOUNT_NOT_PLAYER", "responsible-play settings belong to player accounts")

    async def set_limit(self, account: str, kind: LimitKind, value: int) -> tuple[ResponsiblePlay, datetime]:
        self._check_player(account)

        async def work(conn: psycopg.AsyncConnection) -> None:
            locked = await self._lock(conn, [account])
            now = self.clock()
            current = (await repo.limits(conn, account)).get(kind) or domain_play.LimitSetting(kind)
            changed = domain_play.decide_limit_change(current, value, now)
            await repo.save_limit(conn, account, changed)
            effective = changed.pending_effective_at if changed.pending_value is not None else now
            assert effective is not None
            event = events.limits_changed(account, changed, value, domain.to_ms(effective))
            await self._append_account(conn, locked[account], [event])

        await self._transaction(work)
        return await self.responsible_play(account)

    async def self_exclude(self, account: str, days: int, permanent: bool) -> tuple[ResponsiblePlay, datetime]:
        self._check_player(account)

        async def work(conn: psycopg.AsyncConnection) -> None:
            locked = await self._lock(conn, [account])
            now = self.clock()
            excluded = domain_play.decide_self_exclusion(await repo.exclusion(conn, account), days, permanent, now)
            await repo.save_exclusion(conn, account, excluded)
            until = 0 if excluded.until is None else domain.to_ms(excluded.until)
            await self._append_account(conn, locked[account], [events.self_excluded(account, until)])

        await self._transaction(work)
        return await self.responsible_play(account)

    # ----------------------------------------------------------------------- settlement

    async def round_settlement(self, round_id: str) -> repo.RoundRecord:
        domain.check_id(round_id, "ROUND_ID")
        async with self._pool.connection() as conn:
            found = await repo.round_record(conn, round_id)
        if found is None:
            raise NotFound("ROUND_NOT_FOUND", f"the wallet has seen no settlement of round {round_id}")
        return found

    async def apply_settlement(
        self, conn: psycopg.AsyncConnection, command: SettlementCommand, source_type: str, source_id: str
    ) -> str:
        """Apply a table's settlement in the caller's transaction; returns "settled", "voided",
        "duplicate" or "rejected". A bad settlement never raises: it is recorded as rejected."""
        if not domain.is_id(command.round_id):
            detail = f"round id {command.round_id!r:.80}"
            await self.reject_settlement(conn, command, source_type, source_id, "ROUND_ID_INVALID", detail)
            return "rejected"
        now = self.clock()
        outcome = "voided" if command.voided else "settled"
        record = await repo.round_record(conn, command.round_id, lock=True)
        digest = settlement_digest(command)
        if record is not None and record.status != "rejected":
            if record.status == outcome and record.digest == digest:
                metrics.SETTLEMENTS_DUPLICATE.inc()
                log.info("settlement already applied", extra={"round_id": command.round_id})
                return "duplicate"
            reason = "ROUND_ALREADY_SETTLED" if record.status == "settled" else "ROUND_ALREADY_VOIDED"
            detail = f"round {command.round_id} was already {record.status}; this {source_type} differs"
            await self.reject_settlement(conn, command, source_type, source_id, reason, detail)
            return "rejected"
        try:
            plan, strays = await self._plan_settlement(conn, command, now)
        except SettlementRejected as rejected:
            await self.reject_settlement(conn, command, source_type, source_id, rejected.reason, rejected.detail)
            return "rejected"
        version = record.version if record else 0
        applied = events.settlement_applied(command.round_id, command.table_id, plan, command.voided, source_id)
        # The writes in one round trip: nothing here reads a result (the hold statuses are checked by
        # the resolutions' statement, the round stream's version by the strict append).
        async with conn.pipeline():
            await repo.save_resolutions(conn, plan.holds)
            await repo.save_movements(conn, plan.movements, "settlement", now)
            await self._store.append_queued(conn, events.round_stream(command.round_id), version, [applied])
            await repo.save_round(
                conn, repo.RoundRecord(command.round_id, command.table_id, outcome, version + 1, digest, "", "", now)
            )
        released = await self._release_strays(conn, strays, now, command.round_id)
        metrics.SETTLEMENTS_APPLIED.labels(outcome).inc()
        for hold in (*plan.holds, *released):
            self._count_resolution(hold)
        log.info(
            "settlement applied",
            extra={"round_id": command.round_id, "outcome": outcome, "movements": len(plan.movements)},
        )
        return outcome

    async def _plan_settlement(
        self, conn: psycopg.AsyncConnection, command: SettlementCommand, now: datetime
    ) -> tuple[domain_settlement.SettlementPlan, list[tuple[str, str]]]:
        """The settlement decided on its locked accounts and holds, and the round's holds it does not name
        (hold id, account; their accounts locked too)."""
        hold_ids = command.all_hold_ids()
        named, others = await repo.settlement_holds(conn, command.round_id, hold_ids)
        # The owners of the round's holds the settlement does not name are locked now too (with
        # the rest, in one order), for _release_strays.
        owners = {h.account for h in named.values()} | {account for _, account in others}
        locks = await repo.lock_for_settlement(conn, command.round_id, command.accounts() | owners, hold_ids)
        states = {n: a.state for n, a in locks.accounts.items()}
        return domain_settlement.decide_settlement(command, states, locks.holds, now), locks.strays

    async def _release_strays(
        self, conn: psycopg.AsyncConnection, strays: list[tuple[str, str]], now: datetime, round_id: str
    ) -> list[Hold]:
        """Release the round's open holds its settlement does not name (``strays``: hold id, account), as
        VoidHold would.

        A bet whose hold the wallet placed but whose recording at the table failed (the table
        timed out waiting for the wallet and could not reach it to void the hold) is in no
        settlement: once the round's one settlement is applied nothing can post that hold, so
        it is released here, in the settlement's transaction, instead of waiting for its expiry.
        The movement is the one VoidHold makes (``void:<hold id>``), so a later VoidHold from the
        table is a replay."""
        released: list[Hold] = []
        for hold_id, account in strays:
            locked = await repo.lock_accounts(conn, [account])  # held already: the current version
            hold = await repo.hold(conn, hold_id, lock=True)
            if hold is None or account not in locked:
                continue
            decision = domain_holds.decide_void(hold, now)
            if decision.replayed:
                continue
            await self._save_resolution(conn, locked, decision, now)
            released.append(decision.hold)
            log.warning(
                "hold of a settled round released: the settlement does not name it",
                extra={"round_id": round_id, "hold_id": hold_id, "amount_minor": hold.amount_minor},
            )
        return released

    async def reject_settlement(
        self,
        conn: psycopg.AsyncConnection,
        command: SettlementCommand,
        source_type: str,
        source_id: str,
        reason: str,
        detail: str,
    ) -> None:
        """Record that nothing of a settlement was applied, and why; an applied round keeps its status."""
        event = events.settlement_rejected(command.round_id, command.table_id, source_type, source_id, reason, detail)
        if not domain.is_id(command.round_id):
            await self._store.append(conn, events.round_stream(f"invalid-{source_id}"), 0, [event])
        else:
            record = await repo.round_record(conn, command.round_id, lock=True)
            version = record.version if record else 0
            await self._store.append(conn, events.round_stream(command.round_id), version, [event])
            applied = record is not None and record.status != "rejected"
            await repo.save_round(
                conn,
                repo.RoundRecord(
                    command.round_id,
                    record.table_id if record and applied else command.table_id,
                    record.status if record and applied else "rejected",
                    version + 1,
                    record.digest if record and applied else settlement_digest(command),
                    reason,
                    detail,
                    self.clock(),
                ),
            )
        self._count_rejection(command, reason, detail)

    @staticmethod
    def _count_rejection(command: SettlementCommand, reason: str, detail: str) -> None:
        metrics.SETTLEMENTS_REJECTED.labels(reason).inc()
        log.error(
            "settlement rejected: nothing of it was applied",
            extra={"round_id": command.round_id, "table_id": command.table_id, "reason": reason, "detail": detail},
        )


def _encode_name_token(name: str) -> str:
    return name.encode().hex()


def _decode_name_token(token: str) -> str:
    if not token:
        return ""
    try:
        name = bytes.fromhex(token).decode()
    except ValueError:
        raise InvalidArgument("PAGE_TOKEN_INVALID", "page_token must come from a previous page") from None
    if "\x00" in name:  # PostgreSQL text cannot hold it: refused here, not an INTERNAL from the query
        raise InvalidArgument("PAGE_TOKEN_INVALID", "page_token must come from a previous page")
    return name
