"""The consumer of the table's settlement events: each applied to the wallet exactly once.

The backbone consumer dedupes by event id and runs this handler in the transaction
that records the event as processed; the application also dedupes by round id, since
a table may emit a round's settlement again. A settlement the wallet cannot apply
(or cannot even read) is recorded as rejected (event, metric, error log) instead of
failing the consumer: one bad round must not stop every round behind it.
"""

from __future__ import annotations

import time

import psycopg
from google.protobuf.message import DecodeError
from niuniu.table.v1 import events_pb2 as table_pb
from niuniu.v1 import events_pb2

from backbone.handlers import Handler
from services.wallet.app import WalletApp
from services.wallet.domain_settlement import SettlementCommand, SettlementTransfer
from services.wallet.metrics import SETTLEMENT_LAG_SECONDS

ROUND_SETTLED = "table.round_settled"
ROUND_VOIDED = "table.round_voided"


def command_from(envelope: events_pb2.EventEnvelope) -> SettlementCommand:
    """The settlement an envelope of type ROUND_SETTLED or ROUND_VOIDED carries. Raises DecodeError/TypeError."""
    if envelope.event_type == ROUND_SETTLED:
        settled = table_pb.RoundSettled()
        _unpack(envelope, settled)
        transfers = tuple(
            SettlementTransfer(t.payer, t.payee, t.amount_minor, t.kind, t.bet_id, t.hold_id) for t in settled.transfers
        )
        return SettlementCommand(settled.round_id, settled.table_id, transfers, tuple(settled.hold_ids))
    assert envelope.event_type == ROUND_VOIDED
    voided = table_pb.RoundVoided()
    _unpack(envelope, voided)
    return SettlementCommand(voided.round_id, voided.table_id, (), tuple(voided.hold_ids), voided=True)


def _unpack(envelope: events_pb2.EventEnvelope, message: table_pb.RoundSettled | table_pb.RoundVoided) -> None:
    if not envelope.payload.Unpack(message):
        raise TypeError(f"{envelope.event_type} carries {envelope.payload.type_url or 'no payload'}")


def make_handler(app: WalletApp) -> Handler:
    async def handle(conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> None:
        if envelope.event_type not in (ROUND_SETTLED, ROUND_VOIDED):
            return  # the table's other events are not the wallet's business
        try:
            command = command_from(envelope)
        except (DecodeError, TypeError) as error:
            # Recorded as rejected under the envelope's round (its correlation id).
            unreadable = SettlementCommand(
                envelope.correlation_id, "", (), (), voided=envelope.event_type == ROUND_VOIDED
            )
            await app.reject_settlement(
                conn, unreadable, envelope.event_type, envelope.event_id, "PAYLOAD_INVALID", str(error)
            )
            return
        await app.apply_settlement(conn, command, envelope.event_type, envelope.event_id)
        # From the table's settlement (right after the last reveal) to the wallet's movements.
        lag_s = time.time() - envelope.occurred_at.ToNanoseconds() / 1e9
        SETTLEMENT_LAG_SECONDS.observe(max(0.0, lag_s))

    return handle
