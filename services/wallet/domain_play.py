"""The wallet's responsible-play rules: deposit and loss limits (a raise waits, a cut applies at once), self-
exclusion, and the checks a deposit or a hold must pass. No I/O, no clock."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from backbone.errors import FailedPrecondition, InvalidArgument
from bull.accounts import CASHIER as CASHIER
from bull.accounts import PLAYER_PREFIX as PLAYER_PREFIX
from bull.accounts import AccountKind as AccountKind
from services.wallet.domain import (
    LIMIT_RAISE_DELAY,
    MAX_AMOUNT_MINOR,
    MAX_REALITY_CHECK_MINUTES,
    MAX_SELF_EXCLUSION_DAYS,
    AccountState,
)


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
