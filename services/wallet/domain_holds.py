"""The wallet's hold rules: a hold placed (the money moved from available to held), resized, and resolved
exactly once by a post, a void or an expiry. No I/O, no clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from backbone.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from bull.accounts import CASHIER as CASHIER
from bull.accounts import PLAYER_PREFIX as PLAYER_PREFIX
from bull.accounts import AccountKind as AccountKind
from services.wallet.domain import (
    DEFAULT_HOLD_TTL,
    MAX_HOLD_TTL,
    MAX_POSTINGS,
    MAX_REASON_CHARS,
    MAX_UNIX_MS,
    AccountState,
    Bucket,
    HoldStatus,
    Movement,
    account_kind,
    check_amount,
    check_id,
    check_optional_id,
    check_text,
    from_ms,
    transfer,
)
from services.wallet.domain_play import (
    ResponsiblePlay,
    check_may_hold,
)


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


def release(hold: Hold, kind: str, movement_id: str, amount_minor: int, round_id: str = "") -> Movement:
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
        movements.append(release(hold, "void", f"void:{hold.hold_id}", hold.amount_minor - total))
    return Decision(hold.resolve(HoldStatus.POSTED, total, now, "post", postings), tuple(movements))


def decide_void(hold: Hold, now: datetime) -> Decision:
    """Release the whole hold; voiding a released hold answers as the first release."""
    if hold.status is not HoldStatus.OPEN:
        if hold.status in (HoldStatus.VOIDED, HoldStatus.EXPIRED):
            return Decision(hold, replayed=True)
        raise _already_resolved(hold)
    movement = release(hold, "void", f"void:{hold.hold_id}", hold.amount_minor)
    return Decision(hold.resolve(HoldStatus.VOIDED, 0, now, "void"), (movement,))


def decide_expire(hold: Hold, now: datetime) -> Decision | None:
    """The sweeper's release of a hold past its time; None when there is nothing to do."""
    if hold.status is not HoldStatus.OPEN or now < hold.expires_at:
        return None
    movement = release(hold, "expire", f"expire:{hold.hold_id}", hold.amount_minor)
    return Decision(hold.resolve(HoldStatus.EXPIRED, 0, now, "expire"), (movement,))
