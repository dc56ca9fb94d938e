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

This module holds the accounts, the input checks and the movements; the other rules build on it:
responsible play (``domain_play``), holds (``domain_holds``) and settlement (``domain_settlement``).
"""

from __future__ import annotations

import re
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from backbone.errors import FailedPrecondition, InvalidArgument
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
