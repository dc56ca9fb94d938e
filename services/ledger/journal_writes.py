"""What both writers of the journal projection write alike (one event at a time, and a poll staged): a refused
movement recorded, a round's rows, and the statement that moves the balances."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import psycopg
from niuniu.table.v1 import events_pb2 as table_pb2
from niuniu.v1 import events_pb2

from services.ledger import metrics
from services.ledger.journal import Rejected

log = logging.getLogger(__name__)

ROUND_SETTLED = table_pb2.RoundSettled.DESCRIPTOR
ROUND_VOIDED = table_pb2.RoundVoided.DESCRIPTOR


@dataclass(frozen=True, slots=True)
class Position:
    topic: str
    partition: int
    offset: int
    wallet_position: int


def move_balances(changes: str) -> str:
    """The one statement that moves the balances: ``changes`` selects (account, bucket, account type, debit,
    credit, balance change, lines) once per (account, bucket), in that order (so that two writers lock the
    rows in one order); each is added to its balance row, created at its first line."""
    return (
        "INSERT INTO balances (account, bucket, account_type, debit_minor, credit_minor, balance_minor, lines) "
        + changes
        + " ON CONFLICT (account, bucket) DO UPDATE SET"
        " debit_minor = balances.debit_minor + EXCLUDED.debit_minor,"
        " credit_minor = balances.credit_minor + EXCLUDED.credit_minor,"
        " balance_minor = balances.balance_minor + EXCLUDED.balance_minor,"
        " lines = balances.lines + EXCLUDED.lines"
    )


# The balance changes of the lines a statement inserted (its ``lines`` CTE).
MOVE_BALANCES_BY_LINES = move_balances(
    "SELECT account, bucket, min(account_type), sum(debit_minor), sum(credit_minor), sum(credit_minor - debit_minor),"
    " count(*) FROM lines GROUP BY account, bucket ORDER BY account, bucket"
)


async def record_reject(
    conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope, position: Position, rejected: Rejected
) -> None:
    log.error(
        "journal refused a movement",
        extra={
            "event_id": envelope.event_id,
            "entry_id": rejected.entry_id,
            "reason": rejected.reason,
            "detail": rejected.detail,
        },
    )
    await conn.execute(
        "INSERT INTO journal_rejects (event_id, movement_index, entry_id, event_type, round_id, reason, detail,"
        ' movement, occurred_at, topic, partition, "offset", wallet_position)'
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (
            envelope.event_id,
            rejected.movement_index,
            rejected.entry_id,
            envelope.event_type,
            envelope.correlation_id,
            rejected.reason,
            rejected.detail,
            rejected.movement,
            envelope.occurred_at.ToDatetime(tzinfo=UTC),
            position.topic,
            position.partition,
            position.offset,
            position.wallet_position,
        ),
    )
    metrics.REJECTS.labels(rejected.reason).inc()


def round_rows(envelope: events_pb2.EventEnvelope) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """The ``rounds`` row (round_id, table_id, variant, status, event_id, occurred_at, bets, transfers, event)
    and the ``round_bets`` rows of a RoundSettled or RoundVoided envelope."""
    occurred_at = envelope.occurred_at.ToDatetime(tzinfo=UTC)
    if envelope.payload.Is(ROUND_SETTLED):
        settled = table_pb2.RoundSettled()
        envelope.payload.Unpack(settled)
        round_id = settled.round_id or envelope.correlation_id
        row = (
            round_id,
            settled.table_id,
            settled.variant,
            "settled",
            envelope.event_id,
            occurred_at,
            len(settled.bets),
            len(settled.transfers),
            settled.SerializeToString(),
        )
        bets = [
            (round_id, b.bet_id, b.player, b.area, b.stake_minor, b.outcome, b.net_minor, b.hold_id)
            for b in settled.bets
        ]
        return row, bets
    voided = table_pb2.RoundVoided()
    envelope.payload.Unpack(voided)
    row = (
        voided.round_id or envelope.correlation_id,
        voided.table_id,
        "",
        "voided",
        envelope.event_id,
        occurred_at,
        0,
        0,
        voided.SerializeToString(),
    )
    return row, []
