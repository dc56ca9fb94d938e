"""The wallet's rules: accounts, holds, settlement and responsible play. No I/O, no clock.

Money is integer minor units. Every movement is a balanced set of legs on
(account, bucket) pairs; a hold (TigerBeetle's pending transfer) moves money from
an account's available bucket to its held bucket, and is resolved exactly once by
a post (all or part of it paid out, the rest released), a void or an expiry.
Invariants are checked when a hold is placed (or resized), so resolving it can never
break them.

The deciders take the loaded state and the time, and return what to save; they
raise ``DomainError`` subclasses for operating errors (bad input, short funds) and
``AssertionError`` only for programming errors.
"""

from __future__ import annotations

import re
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from backbone.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from bull.accounts import CASHIER as CASHIER
from bull.accounts import JACKPOT_POOL, SYSTEM_ACCOUNTS
from bull.accounts import PLAYER_PREFIX as PLAYER_PREFIX
from bull.accounts import AccountKind as AccountKind

MAX_AMOUNT_MINOR = 10**15
"""No single amount (deposit, hold, posting, transfer, limit) may exceed this."""
MAX_BALANCE_MINOR = 10**17
"""No account's bucket may grow beyond this (int64 stays far away)."""
DEFAULT_HOLD_TTL = timedelta(hours=1)
MAX_HOLD_TTL = timedelta(days=7)
MAX_POSTINGS = 100
MAX_REASON_CHARS = 200
MAX_KIND_CHARS = 64
LIMIT_RAISE_DELAY = timedelta(hours=24)
MAX_REALITY_CHECK_MINUTES = 24 * 60
MAX_SELF_EXCLUSION_DAYS = 3650
MAX_UNIX_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: the last moment a datetime holds; a later time is refused, not an overflow."""

_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_USERNAME = re.compile(r"[A-Za-z0-9._\-]{3,32}")
_EMAIL = re.compile(r"[^@\s]{1,64}@[^@\s]{1,189}\.[^@\s.]{1,63}")
MIN_PASSWORD_CHARS = 8
MAX_PASSWORD_CHARS = 128


class Bucket(StrEnum):
    AVAILABLE = "available"
    HELD = "held"


class HoldStatus(StrEnum):
    OPEN = "open"
    POSTED = "posted"
    VOIDED = "voided"
    EXPIRED = "expired"


class Role(StrEnum):
    PLAYER = "player"
    ADMIN = "admin"
    AUDITOR = "auditor"
    CASHIER = "cashier"  # a payment integration: Deposit/Withdraw on player accounts only


# --------------------------------------------------------------------------- input


def is_id(value: str) -> bool:
    return _ID.fullmatch(value) is not None


def check_id(value: str, name: str) -> str:
    """A client-chosen id or idempotency key; ``name`` gives the reason (``HOLD_ID`` -> HOLD_ID_INVALID)."""
    if not _ID.fullmatch(value):
        raise InvalidArgument(f"{name}_INVALID", f"{name.lower()} must be 1..128 of [A-Za-z0-9._:-], got {value!r:.80}")
    return value


def check_optional_id(value: str, name: str) -> str:
    return check_id(value, name) if value else ""


def check_uuid(value: str, name: str) -> str:
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        raise InvalidArgument(f"{name}_INVALID", f"{name.lower()} must be a UUID, got {value!r:.80}") from None
    if str(parsed) != value:
        raise InvalidArgument(f"{name}_INVALID", f"{name.lower()} must be a lowercase, dashed UUID")
    return value


def check_amount(amount_minor: int, name: str = "amount_minor") -> int:
    if amount_minor <= 0:
        raise InvalidArgument("AMOUNT_NOT_POSITIVE", f"{name} must be > 0, got {amount_minor}")
    if amount_minor > MAX_AMOUNT_MINOR:
        raise InvalidArgument("AMOUNT_TOO_LARGE", f"{name} must be <= {MAX_AMOUNT_MINOR}, got {amount_minor}")
    return amount_minor


def check_text(value: str, name: str, max_chars: int) -> str:
    if len(value) > max_chars or any(ord(c) < 32 for c in value):
        raise InvalidArgument(f"{name}_INVALID", f"{name.lower()} must be at most {max_chars} printable characters")
    return value


def account_kind(account: str) -> AccountKind:
    """The kind of a well-formed account name; INVALID_ARGUMENT (ACCOUNT_INVALID) otherwise."""
    if account in SYSTEM_ACCOUNTS:
        return AccountKind.SYSTEM
    if account == CASHIER:
        return AccountKind.EXTERNAL
    if account.startswith(PLAYER_PREFIX):
        try:
            check_uuid(account.removeprefix(PLAYER_PREFIX), "ACCOUNT")
        except InvalidArgument:
            pass
        else:
            return AccountKind.PLAYER
    raise InvalidArgument(
        "ACCOUNT_INVALID", f"account must be 'player:<uuid>', a system account or {CASHIER}, got {account!r:.80}"
    )


def player_account(account_id: str) -> str:
    return PLAYER_PREFIX + account_id


def is_username(value: str) -> bool:
    """Whether ``value`` could name an account (3..32 of [A-Za-z0-9._-]); no other name is ever looked up."""
    return _USERNAME.fullmatch(value) is not None


def check_registration(username: str, email: str, password: str) -> None:
    if not _USERNAME.fullmatch(username):
        raise InvalidArgument("USERNAME_INVALID", "username must be 3..32 of [A-Za-z0-9._-]")
    if len(email) > 254 or not _EMAIL.fullmatch(email) or not email.isprintable():
        raise InvalidArgument("EMAIL_INVALID", "email must look like name@example.org")
    if not MIN_PASSWORD_CHARS <= len(password) <= MAX_PASSWORD_CHARS:
        raise InvalidArgument(
            "PASSWORD_INVALID", f"password must be {MIN_PASSWORD_CHARS}..{MAX_PASSWORD_CHARS} characters"
        )


def to_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def from_ms(unix_ms: int) -> datetime:
    return datetime.fromtimestamp(unix_ms / 1000, UTC)


# --------------------------------------------------------------------------- money


@dataclass(frozen=True, slots=True)
class Leg:
    account: str
    bucket: Bucket
    amount_minor: int


@dataclass(frozen=True, slots=True)
class Movement:
    """A balanced set of legs; ``kind`` says why (deposit, hold, post, void, win, ...)."""

    movement_id: str
    kind: str
    legs: tuple[Leg, ...]
    round_id: str = ""
    hold_id: str = ""
    bet_id: str = ""

    def __post_init__(self) -> None:
        assert self.legs, "a movement has legs"
        assert all(leg.amount_minor != 0 for leg in self.legs), "no zero legs"
        assert sum(leg.amount_minor for leg in self.legs) == 0, f"movement {self.movement_id} does not balance"


def transfer(
    movement_id: str,
    kind: str,
    payer: tuple[str, Bucket],
    payee: tuple[str, Bucket],
    amount_minor: int,
    *,
    round_id: str = "",
    hold_id: str = "",
    bet_id: str = "",
) -> Movement:
    assert amount_minor > 0
    legs = (Leg(payer[0], payer[1], -amount_minor), Leg(payee[0], payee[1], amount_minor))
    return Movement(movement_id, kind, legs, round_id, hold_id, bet_id)


@dataclass(frozen=True, slots=True)
class AccountState:
    account: str
    kind: AccountKind
    available_minor: int = 0
    held_minor: int = 0


def net_by_account(movements: Iterable[Movement]) -> dict[str, tuple[int, int]]:
    """(available delta, held delta) per account."""
    available: dict[str, int] = defaultdict(int)
    held: dict[str, int] = defaultdict(int)
    for movement in movements:
        for leg in movement.legs:
            target = available if leg.bucket is Bucket.AVAILABLE else held
            target[leg.account] += leg.amount_minor
    return {a: (available[a], held[a]) for a in sorted({*available, *held})}


def apply_movements(accounts: Mapping[str, AccountState], movements: Sequence[Movement]) -> dict[str, AccountState]:
    """The accounts after ``movements``: a player's available and everyone's held never below zero."""
    after: dict[str, AccountState] = {}
    for account, (d_available, d_held) in net_by_account(movements).items():
        before = accounts[account]
        state = replace(
            before,
            available_minor=before.available_minor + d_available,
            held_minor=before.held_minor + d_held,
        )
        assert state.held_minor >= 0, f"{account}: held below zero"
        if state.available_minor < 0 and not state.kind.may_go_below_zero:
            raise FailedPrecondition(
                "INSUFFICIENT_FUNDS", f"{account} has {before.available_minor} available, needs {-d_available}"
            )
        if max(abs(state.available_minor), state.held_minor) > MAX_BALANCE_MINOR:
            raise FailedPrecondition("BALANCE_TOO_LARGE", f"{account} would exceed {MAX_BALANCE_MINOR}")
        after[account] = state
    return after


def deposit(request_id: str, account: AccountState, amount_minor: int) -> Movement:
    _check_cashable(account, deposit=True)
    return transfer(
        f"deposit:{request_id}",
        "deposit",
        (CASHIER, Bucket.AVAILABLE),
        (account.account, Bucket.AVAILABLE),
        amount_minor,
    )


def withdrawal(request_id: str, account: AccountState, amount_minor: int) -> Movement:
    """Money out to the cashier: never more than the account has available, whatever its kind
    (a system account runs negative only through a settlement, never through a withdrawal)."""
    _check_cashable(account)
    if account.available_minor < amount_minor:
        raise FailedPrecondition(
            "INSUFFICIENT_FUNDS", f"{account.account} has {account.available_minor} available, needs {amount_minor}"
        )
    return transfer(
        f"withdrawal:{request_id}",
        "withdrawal",
        (account.account, Bucket.AVAILABLE),
        (CASHIER, Bucket.AVAILABLE),
        amount_minor,
    )


def _check_cashable(account: AccountState, *, deposit: bool = False) -> None:
    """A player's money comes in from and goes out to the cashier; of the operator's accounts only
    the jackpot pool takes cash in (the operator seeding it). The house, revenue and expense move
    only through settlements, so their balances stay what the rounds made them."""
    if account.kind is AccountKind.EXTERNAL:
        raise InvalidArgument("ACCOUNT_NOT_ALLOWED", f"{account.account} is the other side of every deposit")
    if account.kind is AccountKind.PLAYER or (deposit and account.account == JACKPOT_POOL):
        return
    takes = "deposits to the jackpot pool and player accounts" if deposit else "withdrawals from player accounts"
    raise InvalidArgument(
        "ACCOUNT_NOT_ALLOWED", f"{account.account} is a system account: the wallet takes {takes} only"
    )


# --------------------------------------------------------------------------- responsible play


class LimitKind(StrEnum):
    DAILY_DEPOSIT = "daily_deposit"
    WEEKLY_DEPOSIT = "weekly_deposit"
    DAILY_LOSS = "daily_loss"
    WEEKLY_LOSS = "weekly_loss"
    REALITY_CHECK_MINUTES = "reality_check_minutes"

    @property
    def window(self) -> timedelta:
        return timedelta(days=7) if self.name.startswith("WEEKLY") else timedelta(days=1)

    @property
    def is_deposit(self) -> bool:
        return self in (LimitKind.DAILY_DEPOSIT, LimitKind.WEEKLY_DEPOSIT)

    @property
    def is_loss(self) -> bool:
        return self in (LimitKind.DAILY_LOSS, LimitKind.WEEKLY_LOSS)


MONEY_LIMITS = (LimitKind.DAILY_DEPOSIT, LimitKind.WEEKLY_DEPOSIT, LimitKind.DAILY_LOSS, LimitKind.WEEKLY_LOSS)


@dataclass(frozen=True, slots=True)
class LimitSetting:
    """A limit (0 = none) and a pending loosening that takes effect at ``pending_effective_at``."""

    kind: LimitKind
    value: int = 0
    pending_value: int | None = None
    pending_effective_at: datetime | None = None

    def settled(self, now: datetime) -> LimitSetting:
        """This setting with a due pending change folded in."""
        if (
            self.pending_value is not None
            and self.pending_effective_at is not None
            and now >= self.pending_effective_at
        ):
            return LimitSetting(self.kind, self.pending_value)
        return self

    def in_force(self, now: datetime) -> int:
        return self.settled(now).value


def decide_limit_change(current: LimitSetting, value: int, now: datetime) -> LimitSetting:
    """Tightening applies at once (and cancels a pending loosening); loosening waits 24 hours."""
    ceiling = MAX_REALITY_CHECK_MINUTES if current.kind is LimitKind.REALITY_CHECK_MINUTES else MAX_AMOUNT_MINOR
    if not 0 <= value <= ceiling:
        raise InvalidArgument("LIMIT_INVALID", f"{current.kind.value} must be 0..{ceiling} (0 removes it)")
    settled = current.settled(now)
    if current.kind is LimitKind.REALITY_CHECK_MINUTES:
        return LimitSetting(current.kind, value)
    tighter = value != 0 and (settled.value == 0 or value <= settled.value)
    if tighter:
        return LimitSetting(current.kind, value)
    return LimitSetting(current.kind, settled.value, value, now + LIMIT_RAISE_DELAY)


@dataclass(frozen=True, slots=True)
class Exclusion:
    until: datetime | None = None
    permanent: bool = False

    def active(self, now: datetime) -> bool:
        return self.permanent or (self.until is not None and now < self.until)


def decide_self_exclusion(current: Exclusion, days: int, permanent: bool, now: datetime) -> Exclusion:
    """A new exclusion, or a longer one; never a shorter one while one is in force."""
    if permanent:
        return Exclusion(None, True)
    if not 1 <= days <= MAX_SELF_EXCLUSION_DAYS:
        raise InvalidArgument("DAYS_INVALID", f"days must be 1..{MAX_SELF_EXCLUSION_DAYS} (or permanent)")
    wanted = Exclusion(now + timedelta(days=days))
    if current.active(now) and (
        current.permanent or (current.until is not None and wanted.until is not None and current.until > wanted.until)
    ):
        raise FailedPrecondition("SELF_EXCLUSION_ACTIVE", "an exclusion in force can be extended, never shortened")
    return wanted


@dataclass(frozen=True, slots=True)
class ResponsiblePlay:
    """An account's limits and exclusion, with what is used of each money limit's window."""

    limits: Mapping[LimitKind, LimitSetting] = field(default_factory=dict)
    exclusion: Exclusion = field(default_factory=Exclusion)
    used_minor: Mapping[LimitKind, int] = field(default_factory=dict)

    def setting(self, kind: LimitKind) -> LimitSetting:
        return self.limits.get(kind) or LimitSetting(kind)


def check_may_deposit(play: ResponsiblePlay, amount_minor: int, now: datetime) -> None:
    for kind in (LimitKind.DAILY_DEPOSIT, LimitKind.WEEKLY_DEPOSIT):
        limit = play.setting(kind).in_force(now)
        used = play.used_minor.get(kind, 0)
        if limit and used + amount_minor > limit:
            raise FailedPrecondition(
                "DEPOSIT_LIMIT_REACHED",
                f"{kind.value} limit {limit}: {used} deposited in the window, {amount_minor} more is too much",
            )


def loss_limit_in_force(play: ResponsiblePlay, now: datetime) -> bool:
    """Whether ``check_may_hold`` reads the losses of a window (without a loss limit it never does)."""
    return any(play.setting(kind).in_force(now) for kind in (LimitKind.DAILY_LOSS, LimitKind.WEEKLY_LOSS))


def check_may_hold(play: ResponsiblePlay, account: AccountState, amount_minor: int, now: datetime) -> None:
    """Self-exclusion, then loss limits: net losses in the window plus everything held may not pass the limit."""
    if play.exclusion.active(now):
        until = "permanently" if play.exclusion.permanent else f"until {play.exclusion.until:%Y-%m-%dT%H:%M:%SZ}"
        raise FailedPrecondition("SELF_EXCLUDED", f"the account is self-excluded {until}")
    for kind in (LimitKind.DAILY_LOSS, LimitKind.WEEKLY_LOSS):
        limit = play.setting(kind).in_force(now)
        used = play.used_minor.get(kind, 0)
        worst = used + account.held_minor + amount_minor
        if limit and worst > limit:
            raise FailedPrecondition(
                "LOSS_LIMIT_REACHED",
                f"{kind.value} limit {limit}: {used} lost in the window and {account.held_minor} held;"
                f" a hold of {amount_minor} could lose more than the limit",
            )


# --------------------------------------------------------------------------- holds


@dataclass(frozen=True, slots=True)
class HoldRequest:
    hold_id: str
    account: str
    amount_minor: int
    reason: str
    round_id: str
    expires_at_unix_ms: int  # as asked (0 = default), compared on a repeat


@dataclass(frozen=True, slots=True)
class Hold:
    request: HoldRequest
    expires_at: datetime
    placed_at: datetime
    status: HoldStatus = HoldStatus.OPEN
    posted_minor: int = 0
    released_minor: int = 0
    resolved_at: datetime | None = None
    resolved_by: str = ""
    postings: tuple[tuple[str, int], ...] = ()
    # The amount the last ResizeHold set; None while the hold holds what was placed. The
    # request keeps the placed amount: a repeat of PlaceHold is compared with it.
    resized_minor: int | None = None

    @property
    def hold_id(self) -> str:
        return self.request.hold_id

    @property
    def account(self) -> str:
        return self.request.account

    @property
    def amount_minor(self) -> int:
        """What the hold holds now (posted and released from when it is resolved)."""
        return self.request.amount_minor if self.resized_minor is None else self.resized_minor

    def resolve(
        self, status: HoldStatus, posted_minor: int, now: datetime, by: str, postings: tuple[tuple[str, int], ...] = ()
    ) -> Hold:
        assert self.status is HoldStatus.OPEN, f"hold {self.hold_id} resolved twice"
        assert 0 <= posted_minor <= self.amount_minor
        return replace(
            self,
            status=status,
            posted_minor=posted_minor,
            released_minor=self.amount_minor - posted_minor,
            resolved_at=now,
            resolved_by=by,
            postings=postings,
        )


def check_hold_request(request: HoldRequest) -> HoldRequest:
    check_id(request.hold_id, "HOLD_ID")
    if account_kind(request.account) is not AccountKind.PLAYER:
        raise InvalidArgument("ACCOUNT_NOT_HOLDABLE", "holds are taken on player accounts only")
    check_amount(request.amount_minor)
    check_text(request.reason, "REASON", MAX_REASON_CHARS)
    check_optional_id(request.round_id, "ROUND_ID")
    if not 0 <= request.expires_at_unix_ms <= MAX_UNIX_MS:
        raise InvalidArgument("EXPIRES_AT_INVALID", f"expires_at_unix_ms must be 0..{MAX_UNIX_MS}")
    return request


@dataclass(frozen=True, slots=True)
class ResizeRequest:
    resize_id: str
    hold_id: str
    amount_minor: int
    expected_minor: int = 0
    """When positive, what the hold must hold for the resize to apply (a conditional resize); not kept."""


@dataclass(frozen=True, slots=True)
class Resize:
    """One ResizeHold as recorded: the hold went from ``previous_minor`` to ``request.amount_minor``."""

    request: ResizeRequest
    previous_minor: int
    resized_at: datetime


@dataclass(frozen=True, slots=True)
class Decision:
    """What a command decided: the hold as it now is, the movements to save, and whether it was a repeat."""

    hold: Hold
    movements: tuple[Movement, ...] = ()
    replayed: bool = False
    resize: Resize | None = None  # ResizeHold: the record to save with the movement


def decide_place_hold(
    request: HoldRequest, existing: Hold | None, account: AccountState, play: ResponsiblePlay, now: datetime
) -> Decision:
    if existing is not None:
        if existing.request != request:
            raise AlreadyExists("HOLD_ID_REUSED", f"hold {request.hold_id} exists with different fields")
        return Decision(existing, replayed=True)
    expires_at = now + DEFAULT_HOLD_TTL if request.expires_at_unix_ms == 0 else from_ms(request.expires_at_unix_ms)
    if not now < expires_at <= now + MAX_HOLD_TTL:
        raise InvalidArgument("EXPIRES_AT_INVALID", f"expires_at must be in the future and at most {MAX_HOLD_TTL} away")
    check_may_hold(play, account, request.amount_minor, now)
    if account.available_minor < request.amount_minor:
        raise FailedPrecondition(
            "INSUFFICIENT_FUNDS",
            f"{account.account} has {account.available_minor} available, the hold needs {request.amount_minor}",
        )
    movement = transfer(
        f"hold:{request.hold_id}",
        "hold",
        (request.account, Bucket.AVAILABLE),
        (request.account, Bucket.HELD),
        request.amount_minor,
        round_id=request.round_id,
        hold_id=request.hold_id,
    )
    return Decision(Hold(request, expires_at, now), (movement,))


def check_resize_request(request: ResizeRequest) -> ResizeRequest:
    check_id(request.resize_id, "RESIZE_ID")
    check_id(request.hold_id, "HOLD_ID")
    check_amount(request.amount_minor)
    if request.expected_minor < 0:
        raise InvalidArgument("EXPECTED_INVALID", "expected_minor must be 0 (any) or the amount the hold holds")
    return request


def decide_resize(
    request: ResizeRequest,
    existing: Resize | None,
    hold: Hold,
    account: AccountState,
    play: ResponsiblePlay,
    now: datetime,
) -> Decision:
    """Change an open hold's amount: a larger hold takes the difference from the available
    balance (with PlaceHold's checks on the increase), a smaller one releases it. With
    ``expected_minor``, only a hold that holds that amount changes (``HOLD_CHANGED`` otherwise). A
    repeat of the same resize answers with the hold as it is now."""
    if existing is not None:
        if (existing.request.hold_id, existing.request.amount_minor) != (request.hold_id, request.amount_minor):
            raise AlreadyExists("RESIZE_ID_REUSED", f"resize {request.resize_id} was made with other fields")
        return Decision(hold, replayed=True)
    assert hold.hold_id == request.hold_id and hold.account == account.account
    if hold.status is not HoldStatus.OPEN:  # the same answers as PostHold's
        raise _already_resolved(hold)
    if now >= hold.expires_at:  # as good as expired, whether or not the sweeper has run yet
        raise FailedPrecondition("HOLD_EXPIRED", f"hold {hold.hold_id} expired at {hold.expires_at.isoformat()}")
    if request.expected_minor and request.expected_minor != hold.amount_minor:
        raise FailedPrecondition(
            "HOLD_CHANGED", f"hold {hold.hold_id} holds {hold.amount_minor}, not the {request.expected_minor} expected"
        )
    change = request.amount_minor - hold.amount_minor
    if change > 0:
        check_may_hold(play, account, change, now)
        if account.available_minor < change:
            raise FailedPrecondition(
                "INSUFFICIENT_FUNDS",
                f"{account.account} has {account.available_minor} available, the larger hold needs {change} more",
            )
    movements: tuple[Movement, ...] = ()
    if change:
        available, held = (hold.account, Bucket.AVAILABLE), (hold.account, Bucket.HELD)
        movements = (
            transfer(
                f"resize:{request.resize_id}",
                "hold_resize",
                available if change > 0 else held,
                held if change > 0 else available,
                abs(change),
                round_id=hold.request.round_id,
                hold_id=hold.hold_id,
            ),
        )
    resized = replace(hold, resized_minor=request.amount_minor)
    return Decision(resized, movements, resize=Resize(request, hold.amount_minor, now))


def check_postings(hold_account: str, postings: Sequence[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    if not postings:
        raise InvalidArgument("POSTINGS_EMPTY", "post at least one amount (VoidHold releases a whole hold)")
    if len(postings) > MAX_POSTINGS:
        raise InvalidArgument("POSTINGS_TOO_MANY", f"at most {MAX_POSTINGS} postings")
    for payee, amount_minor in postings:
        if account_kind(payee) is AccountKind.EXTERNAL or payee == hold_account:
            raise InvalidArgument("PAYEE_INVALID", f"{payee} cannot be paid from this hold")
        check_amount(amount_minor)
    return tuple(postings)


def _release(hold: Hold, kind: str, movement_id: str, amount_minor: int, round_id: str = "") -> Movement:
    return transfer(
        movement_id,
        kind,
        (hold.account, Bucket.HELD),
        (hold.account, Bucket.AVAILABLE),
        amount_minor,
        round_id=round_id or hold.request.round_id,
        hold_id=hold.hold_id,
    )


def _already_resolved(hold: Hold) -> FailedPrecondition:
    if hold.status is HoldStatus.EXPIRED:
        return FailedPrecondition("HOLD_EXPIRED", f"hold {hold.hold_id} expired")
    return FailedPrecondition(
        "HOLD_ALREADY_RESOLVED", f"hold {hold.hold_id} was already resolved ({hold.status.value} by {hold.resolved_by})"
    )


def decide_post(hold: Hold, postings: tuple[tuple[str, int], ...], now: datetime) -> Decision:
    """Pay ``postings`` out of the hold and release the rest; a repeat of the same post answers as the first."""
    if hold.status is not HoldStatus.OPEN:
        if hold.status is HoldStatus.POSTED and hold.resolved_by == "post" and hold.postings == postings:
            return Decision(hold, replayed=True)
        raise _already_resolved(hold)
    if now >= hold.expires_at:
        raise FailedPrecondition("HOLD_EXPIRED", f"hold {hold.hold_id} expired at {hold.expires_at.isoformat()}")
    total = sum(amount for _, amount in postings)
    if total > hold.amount_minor:
        raise InvalidArgument("POSTINGS_EXCEED_HOLD", f"postings total {total} > hold {hold.amount_minor}")
    movements = [
        transfer(
            f"post:{hold.hold_id}:{i}",
            "post",
            (hold.account, Bucket.HELD),
            (payee, Bucket.AVAILABLE),
            amount,
            round_id=hold.request.round_id,
            hold_id=hold.hold_id,
        )
        for i, (payee, amount) in enumerate(postings)
    ]
    if total < hold.amount_minor:
        movements.append(_release(hold, "void", f"void:{hold.hold_id}", hold.amount_minor - total))
    return Decision(hold.resolve(HoldStatus.POSTED, total, now, "post", postings), tuple(movements))


def decide_void(hold: Hold, now: datetime) -> Decision:
    """Release the whole hold; voiding a released hold answers as the first release."""
    if hold.status is not HoldStatus.OPEN:
        if hold.status in (HoldStatus.VOIDED, HoldStatus.EXPIRED):
            return Decision(hold, replayed=True)
        raise _already_resolved(hold)
    movement = _release(hold, "void", f"void:{hold.hold_id}", hold.amount_minor)
    return Decision(hold.resolve(HoldStatus.VOIDED, 0, now, "void"), (movement,))


def decide_expire(hold: Hold, now: datetime) -> Decision | None:
    """The sweeper's release of a hold past its time; None when there is nothing to do."""
    if hold.status is not HoldStatus.OPEN or now < hold.expires_at:
        return None
    movement = _release(hold, "expire", f"expire:{hold.hold_id}", hold.amount_minor)
    return Decision(hold.resolve(HoldStatus.EXPIRED, 0, now, "expire"), (movement,))


# --------------------------------------------------------------------------- settlement


class SettlementRejected(Exception):
    """A table's settlement the wallet will not apply (nothing of it is applied)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class SettlementTransfer:
    payer: str
    payee: str
    amount_minor: int
    kind: str
    bet_id: str = ""
    hold_id: str = ""


@dataclass(frozen=True, slots=True)
class SettlementCommand:
    """A table's RoundSettled (``voided`` False) or RoundVoided (``voided`` True)."""

    round_id: str
    table_id: str
    transfers: tuple[SettlementTransfer, ...]
    hold_ids: tuple[str, ...]
    voided: bool = False

    def accounts(self) -> set[str]:
        return {a for t in self.transfers for a in (t.payer, t.payee)}

    def all_hold_ids(self) -> tuple[str, ...]:
        """Listed holds first, then any hold a transfer names that the list forgot, each once."""
        return tuple(dict.fromkeys([*self.hold_ids, *(t.hold_id for t in self.transfers if t.hold_id)]))


@dataclass(frozen=True, slots=True)
class SettlementPlan:
    movements: tuple[Movement, ...]
    holds: tuple[Hold, ...]  # resolved by this settlement
    holds_posted: tuple[str, ...]
    holds_voided: tuple[str, ...]
    holds_skipped: tuple[str, ...]
    accounts_after: Mapping[str, AccountState]
    player_net_minor: Mapping[str, int]  # each player's balance change (negative = a loss)


def _reject_unless(ok: bool, reason: str, detail: str) -> None:
    if not ok:
        raise SettlementRejected(reason, detail)


def _settlement_account(accounts: Mapping[str, AccountState], account: str) -> AccountState:
    try:
        kind = account_kind(account)
    except InvalidArgument:
        raise SettlementRejected("ACCOUNT_INVALID", f"{account!r:.80} is not an account name") from None
    _reject_unless(kind is not AccountKind.EXTERNAL, "ACCOUNT_NOT_ALLOWED", f"{account} cannot take part in a round")
    state = accounts.get(account)
    if state is None:
        raise SettlementRejected("ACCOUNT_NOT_FOUND", f"no account {account}")
    return state


def decide_settlement(
    command: SettlementCommand, accounts: Mapping[str, AccountState], holds: Mapping[str, Hold], now: datetime
) -> SettlementPlan:
    """The whole settlement, or SettlementRejected: every transfer funded, every hold resolved once."""
    round_id = command.round_id
    _reject_unless(is_id(round_id), "ROUND_ID_INVALID", f"round id {round_id!r:.80}")
    _reject_unless(not (command.voided and command.transfers), "PAYLOAD_INVALID", "a voided round moves no money")
    movements: list[Movement] = []
    taken: dict[str, int] = defaultdict(int)
    credited: dict[str, int] = defaultdict(int)
    for i, t in enumerate(command.transfers):
        movements.append(_settlement_transfer(command, i, t, accounts, holds, taken, credited))
    resolved: list[Hold] = []
    posted: list[str] = []
    voided: list[str] = []
    skipped: list[str] = []
    for hold_id in command.all_hold_ids():
        hold = holds.get(hold_id)
        amount = taken.get(hold_id, 0)
        if amount == 0 and (hold is None or hold.status is not HoldStatus.OPEN):
            skipped.append(hold_id)  # nothing owed from it and nothing left to release
            continue
        assert hold is not None
        _check_hold_round(hold, round_id)
        if amount < hold.amount_minor:
            movements.append(
                _release(hold, "void", f"release:{round_id}:{hold_id}", hold.amount_minor - amount, round_id)
            )
        status = HoldStatus.POSTED if amount else HoldStatus.VOIDED
        resolved.append(hold.resolve(status, amount, now, f"settlement:{round_id}"))
        (posted if amount else voided).append(hold_id)
    try:
        after = apply_movements(accounts, movements)
    except FailedPrecondition as error:
        raise SettlementRejected(error.reason, error.message) from None
    nets = {
        account: d_available + d_held
        for account, (d_available, d_held) in net_by_account(movements).items()
        if accounts[account].kind is AccountKind.PLAYER
    }
    return SettlementPlan(tuple(movements), tuple(resolved), tuple(posted), tuple(voided), tuple(skipped), after, nets)


def _check_hold_round(hold: Hold, round_id: str) -> None:
    _reject_unless(
        hold.request.round_id in ("", round_id),
        "HOLD_ROUND_MISMATCH",
        f"hold {hold.hold_id} belongs to round {hold.request.round_id}",
    )


def _settlement_transfer(
    command: SettlementCommand,
    index: int,
    t: SettlementTransfer,
    accounts: Mapping[str, AccountState],
    holds: Mapping[str, Hold],
    taken: dict[str, int],
    credited: dict[str, int],
) -> Movement:
    """One transfer's movement. ``taken``: what earlier transfers drew from each hold;
    ``credited``: what earlier transfers paid each account, less what it paid on without a hold."""
    where = f"transfer {index}"
    _reject_unless(0 < t.amount_minor <= MAX_AMOUNT_MINOR, "AMOUNT_INVALID", f"{where}: amount {t.amount_minor}")
    _reject_unless(0 < len(t.kind) <= MAX_KIND_CHARS, "KIND_INVALID", f"{where}: kind {t.kind!r:.80}")
    _reject_unless(t.payer != t.payee, "TRANSFER_TO_SELF", f"{where}: {t.payer} pays itself")
    payer = _settlement_account(accounts, t.payer)
    _settlement_account(accounts, t.payee)
    if not t.hold_id:
        # A player pays without a hold only out of what this settlement paid it before (a
        # red-envelope dealer paying winners past its pool from the losers' payments), so a
        # settlement never spends a player's own free balance.
        if payer.kind is not AccountKind.SYSTEM:
            _reject_unless(
                t.amount_minor <= credited[t.payer],
                "PAYER_NOT_SYSTEM",
                f"{where}: {t.payer} must pay from a hold or from what this settlement paid it before"
                f" ({credited[t.payer]} of that left, {t.amount_minor} to pay)",
            )
            credited[t.payer] -= t.amount_minor
        source = (t.payer, Bucket.AVAILABLE)
    else:
        hold = holds.get(t.hold_id)
        _reject_unless(hold is not None, "HOLD_NOT_FOUND", f"{where}: no hold {t.hold_id}")
        assert hold is not None
        _reject_unless(
            hold.status is HoldStatus.OPEN, "HOLD_NOT_OPEN", f"{where}: hold {t.hold_id} is {hold.status.value}"
        )
        _reject_unless(hold.account == t.payer, "HOLD_WRONG_ACCOUNT", f"{where}: hold {t.hold_id} is not {t.payer}'s")
        _check_hold_round(hold, command.round_id)
        taken[t.hold_id] += t.amount_minor
        _reject_unless(
            taken[t.hold_id] <= hold.amount_minor,
            "HOLD_INSUFFICIENT",
            f"{where}: hold {t.hold_id} of {hold.amount_minor} cannot cover {taken[t.hold_id]}",
        )
        source = (t.payer, Bucket.HELD)
    credited[t.payee] += t.amount_minor
    return transfer(
        f"settle:{command.round_id}:{index}",
        t.kind,
        source,
        (t.payee, Bucket.AVAILABLE),
        t.amount_minor,
        round_id=command.round_id,
        hold_id=t.hold_id,
        bet_id=t.bet_id,
    )
