"""The Ledger gRPC servicer: a thin adapter (proto -> query -> proto).

Auditors and admins read everything; a player reads only the statement of their
own account. Malformed requests are INVALID_ARGUMENT with a reason code.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf import timestamp_pb2
from niuniu.ledger.v1 import ledger_pb2, ledger_pb2_grpc
from niuniu.table.v1 import events_pb2 as table_pb2
from psycopg_pool import AsyncConnectionPool

from backbone.auth import Role, Tokens, require
from backbone.errors import InvalidArgument, PermissionDenied, clip
from services.ledger import metrics, queries
from services.ledger.accounts import BUCKETS_BY_NAME, AccountError, account_type, player_account

Context = grpc.aio.ServicerContext[Any, Any]

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1_000
MAX_ROUND_ID_CHARS = 200
PAGE_TOKEN_VERSION = "v1"
READERS = (Role.AUDITOR, Role.ADMIN)
_NAME = re.compile(r"[\x21-\x7e]{1,200}")
_PAGE_TOKEN = re.compile(rf"{PAGE_TOKEN_VERSION}:(-?[0-9]{{1,19}}):([0-9]{{1,18}}):([0-9]{{1,9}})")


class LedgerServicer(ledger_pb2_grpc.LedgerServicer):
    def __init__(self, pool: AsyncConnectionPool, tokens: Tokens) -> None:
        self._pool = pool
        self._tokens = tokens

    async def Statement(self, request: ledger_pb2.StatementRequest, context: Context) -> ledger_pb2.StatementResponse:
        principal = self._tokens.authenticate(context)
        require(principal, Role.PLAYER, *READERS)
        kind = _account_type(request.account)
        if principal.role is Role.PLAYER and request.account != player_account(principal.subject):
            raise PermissionDenied("NOT_YOUR_ACCOUNT", "a player may read only their own statement")
        from_time = _time(request, "from_time")
        to_time = _time(request, "to_time")
        if from_time is not None and to_time is not None and from_time > to_time:
            raise InvalidArgument("PERIOD_INVALID", "from_time is after to_time")
        page_size = _page_size(request.page_size)
        after = decode_page_token(request.page_token)
        async with self._pool.connection() as conn:
            page = await queries.statement(
                conn, request.account, from_time=from_time, to_time=to_time, after=after, page_size=page_size
            )
        return ledger_pb2.StatementResponse(
            account=request.account,
            account_type=kind,
            opening_available_minor=page.opening["available"],
            opening_held_minor=page.opening["held"],
            lines=[_statement_line(line) for line in page.lines],
            closing_available_minor=page.closing["available"],
            closing_held_minor=page.closing["held"],
            next_page_token=encode_page_token(page.next_key) if page.next_key else "",
        )

    async def TrialBalance(
        self, request: ledger_pb2.TrialBalanceRequest, context: Context
    ) -> ledger_pb2.TrialBalanceResponse:
        require(self._tokens.authenticate(context), *READERS)
        which = request.WhichOneof("as_of")
        as_of_time = _time(request, "as_of_time") if which == "as_of_time" else None
        as_of_position = request.as_of_position if which == "as_of_position" else None
        if as_of_position is not None and as_of_position < 0:
            raise InvalidArgument("POSITION_INVALID", "as_of_position must be >= 0")
        async with self._pool.connection() as conn:
            trial = await queries.trial_balance(conn, as_of_time=as_of_time, as_of_position=as_of_position)
        if which is None:
            metrics.IMBALANCE_MINOR.set(trial.imbalance_minor)
        return ledger_pb2.TrialBalanceResponse(
            rows=[
                ledger_pb2.TrialBalanceRow(
                    account=row.account,
                    account_type=row.account_type,  # type: ignore[arg-type]
                    bucket=BUCKETS_BY_NAME[row.bucket],
                    debit_minor=row.debit_minor,
                    credit_minor=row.credit_minor,
                    balance_minor=row.balance_minor,
                )
                for row in trial.rows
            ],
            total_debit_minor=trial.total_debit_minor,
            total_credit_minor=trial.total_credit_minor,
            imbalance_minor=trial.imbalance_minor,
            entries=trial.entries,
            last_wallet_position=trial.last_wallet_position,
        )

    async def RoundJournal(
        self, request: ledger_pb2.RoundJournalRequest, context: Context
    ) -> ledger_pb2.RoundJournalResponse:
        require(self._tokens.authenticate(context), *READERS)
        if not _NAME.fullmatch(request.round_id) or len(request.round_id) > MAX_ROUND_ID_CHARS:
            raise InvalidArgument(
                "ROUND_ID_INVALID", f"round_id must be 1..{MAX_ROUND_ID_CHARS} printable ASCII characters"
            )
        async with self._pool.connection() as conn:
            record = await queries.round_record(conn, request.round_id)
        response = ledger_pb2.RoundJournalResponse(
            round_id=record.round_id,
            entries=[journal_entry(entry) for entry in record.entries],
            status=record.status,
            rejects=[
                ledger_pb2.Reject(
                    event_id=r.event_id,
                    movement_index=r.movement_index,
                    entry_id=r.entry_id,
                    reason=r.reason,
                    detail=r.detail,
                )
                for r in record.rejects
            ],
        )
        if record.status == "settled":
            response.settlement.CopyFrom(table_pb2.RoundSettled.FromString(record.event))
        return response


def _account_type(account: str) -> ledger_pb2.AccountType.ValueType:
    if not _NAME.fullmatch(account):  # printable ASCII only: no NUL or newline reaches a query
        raise InvalidArgument("ACCOUNT_INVALID", f"{clip(account)} is not an account name")
    try:
        return account_type(account)
    except AccountError:
        raise InvalidArgument("ACCOUNT_INVALID", f"{clip(account)} is not in the chart of accounts") from None


def _time(request: Any, name: str) -> datetime | None:
    if not request.HasField(name):
        return None
    stamp: timestamp_pb2.Timestamp = getattr(request, name)
    try:
        return stamp.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError) as error:
        raise InvalidArgument("TIME_INVALID", f"{name} is not a valid time: {error}") from None


def _page_size(requested: int) -> int:
    if requested == 0:
        return DEFAULT_PAGE_SIZE
    if not 0 < requested <= MAX_PAGE_SIZE:
        raise InvalidArgument("PAGE_SIZE_INVALID", f"page_size must be 1..{MAX_PAGE_SIZE} (0 for the default)")
    return requested


def encode_page_token(key: queries.StatementKey) -> str:
    micros = int(key.occurred_at.timestamp()) * 1_000_000 + key.occurred_at.microsecond
    raw = f"{PAGE_TOKEN_VERSION}:{micros}:{key.seq}:{key.line_no}"
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_page_token(token: str) -> queries.StatementKey | None:
    if not token:
        return None
    try:
        # ASCII digits only (int() also reads '١٢٣'), each bounded to what a key can hold.
        matched = _PAGE_TOKEN.fullmatch(base64.urlsafe_b64decode(token.encode()).decode())
        if matched is None:
            raise ValueError("not a page token")
        micros, seq, line_no = matched.groups()
        seconds, rest = divmod(int(micros), 1_000_000)
        occurred_at = datetime.fromtimestamp(seconds, UTC).replace(microsecond=rest)
        return queries.StatementKey(occurred_at, int(seq), int(line_no))
    except (ValueError, UnicodeDecodeError, binascii.Error, OverflowError, OSError):
        raise InvalidArgument("PAGE_TOKEN_INVALID", "page_token is not one this service issued") from None


def _timestamp(moment: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def journal_entry(entry: queries.EntryRecord) -> ledger_pb2.JournalEntry:
    return ledger_pb2.JournalEntry(
        entry_id=entry.entry_id,
        event_id=entry.event_id,
        event_type=entry.event_type,
        kind=entry.kind,
        round_id=entry.round_id,
        hold_id=entry.hold_id,
        bet_id=entry.bet_id,
        occurred_at=_timestamp(entry.occurred_at),
        position=ledger_pb2.EventPosition(
            topic=entry.topic, partition=entry.partition, offset=entry.offset, wallet_position=entry.wallet_position
        ),
        lines=[
            ledger_pb2.JournalLine(
                account=line.account,
                bucket=BUCKETS_BY_NAME[line.bucket],
                debit_minor=line.debit_minor,
                credit_minor=line.credit_minor,
            )
            for line in entry.lines
        ],
    )


def _statement_line(line: queries.StatementLine) -> ledger_pb2.StatementLine:
    entry = line.entry
    return ledger_pb2.StatementLine(
        entry_id=entry.entry_id,
        event_id=entry.event_id,
        event_type=entry.event_type,
        kind=entry.kind,
        round_id=entry.round_id,
        hold_id=entry.hold_id,
        bet_id=entry.bet_id,
        occurred_at=_timestamp(entry.occurred_at),
        bucket=BUCKETS_BY_NAME[line.bucket],
        debit_minor=line.debit_minor,
        credit_minor=line.credit_minor,
        available_after_minor=line.available_after_minor,
        held_after_minor=line.held_after_minor,
    )
