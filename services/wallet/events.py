"""The wallet's events (niuniu.wallet.v1), built from domain values: one event type name per fact."""

from __future__ import annotations

from collections.abc import Iterable

from niuniu.wallet.v1 import events_pb2 as pb

from backbone.eventstore import NewEvent
from services.wallet.domain import Bucket, Movement, to_ms
from services.wallet.domain_holds import Hold, Resize
from services.wallet.domain_play import LimitSetting
from services.wallet.domain_settlement import SettlementPlan

ACCOUNT_OPENED = "wallet.account_opened"
DEPOSITED = "wallet.deposited"
WITHDRAWN = "wallet.withdrawn"
HOLD_PLACED = "wallet.hold_placed"
HOLD_POSTED = "wallet.hold_posted"
HOLD_RESIZED = "wallet.hold_resized"
HOLD_VOIDED = "wallet.hold_voided"
ROUND_SETTLEMENT_APPLIED = "wallet.round_settlement_applied"
ROUND_SETTLEMENT_REJECTED = "wallet.round_settlement_rejected"
LIMITS_CHANGED = "wallet.limits_changed"
SELF_EXCLUDED = "wallet.self_excluded"

_BUCKETS = {Bucket.AVAILABLE: pb.BUCKET_AVAILABLE, Bucket.HELD: pb.BUCKET_HELD}


def account_stream(account: str) -> str:
    return f"account-{account}"


def round_stream(round_id: str) -> str:
    return f"round-{round_id}"


def movement(m: Movement) -> pb.Movement:
    return pb.Movement(
        movement_id=m.movement_id,
        kind=m.kind,
        legs=[
            pb.Leg(account=leg.account, bucket=_BUCKETS[leg.bucket], amount_minor=leg.amount_minor) for leg in m.legs
        ],
        round_id=m.round_id,
        hold_id=m.hold_id,
        bet_id=m.bet_id,
    )


def account_opened(account: str, username: str, role: str, correlation_id: str) -> NewEvent:
    return NewEvent(ACCOUNT_OPENED, pb.AccountOpened(account=account, username=username, role=role), correlation_id)


def deposited(m: Movement, actor: str, correlation_id: str) -> NewEvent:
    return NewEvent(DEPOSITED, pb.Deposited(movement=movement(m), actor=actor), correlation_id)


def withdrawn(m: Movement, actor: str, correlation_id: str) -> NewEvent:
    return NewEvent(WITHDRAWN, pb.Withdrawn(movement=movement(m), actor=actor), correlation_id)


def hold_placed(h: Hold, m: Movement) -> NewEvent:
    q = h.request
    payload = pb.HoldPlaced(
        hold_id=q.hold_id,
        account=q.account,
        amount_minor=q.amount_minor,
        reason=q.reason,
        round_id=q.round_id,
        expires_at_unix_ms=to_ms(h.expires_at),
        movement=movement(m),
    )
    return NewEvent(HOLD_PLACED, payload, q.round_id or q.hold_id, causation_id=q.hold_id)


def hold_resized(h: Hold, resize: Resize, movements: Iterable[Movement]) -> NewEvent:
    """HoldResized; without a movement when the amount did not change."""
    ms = [movement(m) for m in movements]
    assert len(ms) <= 1
    q = resize.request
    payload = pb.HoldResized(
        hold_id=q.hold_id,
        resize_id=q.resize_id,
        previous_minor=resize.previous_minor,
        amount_minor=q.amount_minor,
        movement=ms[0] if ms else None,
    )
    return NewEvent(HOLD_RESIZED, payload, h.request.round_id or h.hold_id, causation_id=q.resize_id)


def hold_resolved(h: Hold, movements: Iterable[Movement]) -> NewEvent:
    """HoldPosted for a post, HoldVoided (cause "void" or "expire") for a release of the whole hold."""
    correlation = h.request.round_id or h.hold_id
    ms = [movement(m) for m in movements]
    if h.resolved_by == "post":
        payload = pb.HoldPosted(
            hold_id=h.hold_id, posted_minor=h.posted_minor, released_minor=h.released_minor, movements=ms
        )
        return NewEvent(HOLD_POSTED, payload, correlation, causation_id=h.hold_id)
    assert len(ms) == 1
    return NewEvent(
        HOLD_VOIDED, pb.HoldVoided(hold_id=h.hold_id, cause=h.resolved_by, movement=ms[0]), correlation, h.hold_id
    )


def settlement_applied(round_id: str, table_id: str, plan: SettlementPlan, voided: bool, causation: str) -> NewEvent:
    payload = pb.RoundSettlementApplied(
        round_id=round_id,
        table_id=table_id,
        movements=[movement(m) for m in plan.movements],
        holds_posted=plan.holds_posted,
        holds_voided=plan.holds_voided,
        outcome="voided" if voided else "settled",
        holds_skipped=plan.holds_skipped,
    )
    return NewEvent(ROUND_SETTLEMENT_APPLIED, payload, round_id, causation)


def settlement_rejected(
    round_id: str, table_id: str, source_event_type: str, source_event_id: str, reason: str, detail: str
) -> NewEvent:
    payload = pb.RoundSettlementRejected(
        round_id=round_id,
        table_id=table_id,
        source_event_type=source_event_type,
        source_event_id=source_event_id,
        reason=reason,
        detail=detail,
    )
    return NewEvent(ROUND_SETTLEMENT_REJECTED, payload, round_id, source_event_id)


def limits_changed(account: str, setting: LimitSetting, value: int, effective_at_unix_ms: int) -> NewEvent:
    payload = pb.LimitsChanged(
        account=account, limit=setting.kind.value, value=value, effective_at_unix_ms=effective_at_unix_ms
    )
    return NewEvent(LIMITS_CHANGED, payload, account)


def self_excluded(account: str, until_unix_ms: int) -> NewEvent:
    return NewEvent(SELF_EXCLUDED, pb.SelfExcluded(account=account, until_unix_ms=until_unix_ms), account)
