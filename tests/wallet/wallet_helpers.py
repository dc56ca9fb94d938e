"""The wallet service in-process on the real PostgreSQL/Kafka/Redis, and helpers to drive it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import psycopg
import pytest
from argon2 import PasswordHasher
from google.protobuf import any_pb2, timestamp_pb2
from google.protobuf.message import Message
from niuniu.table.v1 import events_pb2 as table_pb
from niuniu.v1 import events_pb2
from niuniu.wallet.v1 import wallet_pb2 as pb
from niuniu.wallet.v1 import wallet_pb2_grpc
from psycopg import sql

from backbone.auth import DEFAULT_TTL_S, Role, Tokens, bearer
from backbone.config import Settings
from backbone.errors import REASON_METADATA_KEY
from backbone.grpcserver import RunningServer
from backbone.service import ServiceContext, start
from backbone.topics import Topics
from services.ledger.journal import journal_event
from services.ledger.queries import EntryRecord
from services.ledger.queries import RoundRecord as LedgerRound
from services.ledger.verify import Finding, RoundEvidence, verify
from services.wallet.app import WalletApp
from services.wallet.server import make_spec
from services.wallet.settlement import make_handler
from services.wallet.throttle import Limit, ThrottlePolicy
from tests.harness import migrate

TOKENS = Tokens.development()
# argon2id still, with parameters cheap enough for tests that register many players.
FAST_HASHER = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
# Tests register many players and send much bad input from one address; the throttle's
# own tests pass the real policy.
TEST_THROTTLE = ThrottlePolicy(address_failures=Limit(100_000, 60), address_attempts=Limit(100_000, 60))
ADMIN = bearer(TOKENS.issue(str(uuid.uuid4()), Role.ADMIN))
AUDITOR = bearer(TOKENS.issue(str(uuid.uuid4()), Role.AUDITOR))
TABLE = bearer(TOKENS.service_token("table", ttl_s=DEFAULT_TTL_S))  # minted at import: outlives a long suite
LEDGER = bearer(TOKENS.service_token("ledger", ttl_s=DEFAULT_TTL_S))
SYSTEM = ("house", "commission_revenue", "rebate_expense", "jackpot_pool", "fees")
CASHIER = "external:cashier"


class FakeClock:
    """The wallet's clock, moved by the test."""

    def __init__(self) -> None:
        now = datetime.now(UTC)
        self.now = now.replace(microsecond=now.microsecond // 1000 * 1000)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


@dataclass
class Player:
    account_id: str
    account: str
    metadata: tuple[tuple[str, str]]


@dataclass
class Wallet:
    stub: wallet_pb2_grpc.WalletAsyncStub
    running: RunningServer
    ctx: ServiceContext
    clock: FakeClock
    topics: Topics
    app: WalletApp
    _names: int = field(default=0)

    async def player(self, deposit_minor: int = 0) -> Player:
        self._names += 1
        name = f"p{self._names}_{uuid.uuid4().hex[:8]}"
        reply = await self.stub.Register(
            pb.RegisterRequest(
                request_id=f"reg-{name}", username=name, email=f"{name}@example.org", password="pw-" + name
            )
        )
        player = Player(reply.account_id, reply.account, bearer(TOKENS.issue(reply.account_id, Role.PLAYER)))
        if deposit_minor:
            await self.deposit(player.account, deposit_minor)
        return player

    async def deposit(self, account: str, amount_minor: int) -> pb.MovementResult:
        request = pb.DepositRequest(request_id=f"dep-{uuid.uuid4().hex}", account=account, amount_minor=amount_minor)
        reply: pb.MovementResult = await self.stub.Deposit(request, metadata=ADMIN)
        return reply

    async def hold(self, account: str, amount_minor: int, round_id: str = "", hold_id: str = "") -> pb.Hold:
        request = pb.PlaceHoldRequest(
            hold_id=hold_id or f"h-{uuid.uuid4().hex}",
            account=account,
            amount_minor=amount_minor,
            reason="bet",
            round_id=round_id,
        )
        reply: pb.HoldResult = await self.stub.PlaceHold(request, metadata=TABLE)
        return reply.hold

    async def resize_hold(
        self, hold_id: str, amount_minor: int, resize_id: str = "", *, expected_minor: int = 0
    ) -> pb.HoldResult:
        request = pb.ResizeHoldRequest(
            resize_id=resize_id or f"rs-{uuid.uuid4().hex}",
            hold_id=hold_id,
            amount_minor=amount_minor,
            expected_minor=expected_minor,
        )
        reply: pb.HoldResult = await self.stub.ResizeHold(request, metadata=TABLE)
        return reply

    async def balance(self, account: str) -> tuple[int, int]:
        reply = await self.stub.GetBalance(pb.GetBalanceRequest(account=account), metadata=ADMIN)
        return reply.available_minor, reply.held_minor

    async def balances(self) -> dict[str, tuple[int, int]]:
        """ListBalances, every page (small pages, to exercise paging)."""
        found: dict[str, tuple[int, int]] = {}
        token = ""
        while True:
            reply = await self.stub.ListBalances(
                pb.ListBalancesRequest(page_token=token, page_size=7), metadata=AUDITOR
            )
            for b in reply.balances:
                found[b.account] = (b.available_minor, b.held_minor)
            token = reply.next_page_token
            if not token:
                return found

    async def settle_direct(self, event_type: str, payload: Message, round_id: str) -> events_pb2.EventEnvelope:
        """Feed the consumer's handler directly, in a transaction, as the consumer would."""
        env = envelope(event_type, payload, round_id)
        await self.feed(env)
        return env

    async def feed(self, env: events_pb2.EventEnvelope) -> None:
        handler = make_handler(self.app)
        async with self.ctx.pool.connection() as conn, conn.transaction():
            await handler(conn, env)

    async def count_events(self, event_type: str | None = None) -> int:
        async with self.ctx.pool.connection() as conn:
            if event_type is None:
                cur = await conn.execute("SELECT count(*) FROM events")
            else:
                cur = await conn.execute("SELECT count(*) FROM events WHERE event_type = %s", (event_type,))
            row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        async with self.ctx.pool.connection() as conn:
            cur = await conn.execute(query, args)
            return list(await cur.fetchall())

    async def journal(self) -> list[EntryRecord]:
        """Every wallet event journaled as the ledger journals it (services.ledger.journal); nothing refused."""
        async with self.ctx.pool.connection() as conn:
            stored = await self.ctx.store.read_all(conn, 0, 1_000_000)
        records: list[EntryRecord] = []
        for item in stored:
            journaled = journal_event(item.envelope)
            assert journaled.rejected == (), journaled.rejected
            at = item.envelope.occurred_at.ToDatetime(UTC)
            records.extend(
                EntryRecord(
                    entry_id=e.entry_id,
                    event_id=item.envelope.event_id,
                    movement_index=e.movement_index,
                    event_type=item.event_type,
                    kind=e.kind,
                    round_id=e.round_id,
                    hold_id=e.hold_id,
                    bet_id=e.bet_id,
                    occurred_at=at,
                    topic="wallet",
                    partition=0,
                    offset=item.position,
                    wallet_position=item.position,
                    lines=e.lines,
                )
                for e in journaled.entries
            )
        return records

    async def ledger_agrees(self) -> None:
        """The ledger's balances rebuilt from the wallet's events are the wallet's ListBalances."""
        rebuilt: dict[str, list[int]] = {}
        for entry in await self.journal():
            for line in entry.lines:
                bucket = 0 if line.bucket == "available" else 1
                rebuilt.setdefault(line.account, [0, 0])[bucket] += line.credit_minor - line.debit_minor
        listed = await self.balances()
        assert {a: tuple(b) for a, b in rebuilt.items() if any(b)} == {a: b for a, b in listed.items() if any(b)}

    async def verify_round(self, settlement: table_pb.RoundSettled) -> list[Finding]:
        """The ledger's verify-round checks (each transfer's movement, every hold resolved) on the journal."""
        entries = tuple(e for e in await self.journal() if e.round_id == settlement.round_id)
        record = LedgerRound(settlement.round_id, "settled", settlement.SerializeToString(), entries, ())
        findings, _ = await verify(RoundEvidence.of(record))
        return findings


def envelope(event_type: str, payload: Message, round_id: str) -> events_pb2.EventEnvelope:
    packed = any_pb2.Any()
    packed.Pack(payload)
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return events_pb2.EventEnvelope(
        event_id=str(uuid.uuid4()),
        stream_id="table-1",
        stream_version=1,
        event_type=event_type,
        occurred_at=ts,
        correlation_id=round_id,
        producer="table",
        payload=packed,
    )


def transfer(payer: str, payee: str, amount: int, kind: str = "loss", hold_id: str = "") -> table_pb.SettlementTransfer:
    return table_pb.SettlementTransfer(
        payer=payer, payee=payee, amount_minor=amount, kind=kind, bet_id=f"b-{uuid.uuid4().hex[:6]}", hold_id=hold_id
    )


def settled(round_id: str, transfers: list[table_pb.SettlementTransfer], hold_ids: list[str]) -> table_pb.RoundSettled:
    return table_pb.RoundSettled(
        table_id="table-1", round_id=round_id, variant="golden_bull", transfers=transfers, hold_ids=hold_ids
    )


@asynccontextmanager
async def wallet_service(
    infra: dict[str, str],
    unique: str,
    clock: FakeClock | None = None,
    *,
    sweep_interval_s: float = 0.1,
    throttle: ThrottlePolicy = TEST_THROTTLE,
) -> AsyncIterator[Wallet]:
    clock = clock or FakeClock()
    spec = make_spec(
        throttle=throttle,
        clock=clock,
        tokens=TOKENS,
        hasher=FAST_HASHER,
        sweep_interval_s=sweep_interval_s,
        consumer_name=f"wallet-settlement-{unique}",
    )
    settings = Settings(
        service="wallet",
        dsn=infra["DATABASE_URL"],
        kafka_bootstrap_servers=infra["KAFKA_BOOTSTRAP_SERVERS"],
        redis_url=infra["REDIS_URL"],
        grpc_port=0,
        metrics_port=0,
    )
    topics = Topics(prefix=f"t{unique}.")
    schema = f"w_{unique}"
    await migrate(spec, settings.dsn, schema)
    running, ctx = await start(spec, settings, topics, schema=schema, tokens=TOKENS)
    app = WalletApp(ctx.pool, ctx.store, TOKENS, clock=clock, hasher=FAST_HASHER)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield Wallet(wallet_pb2_grpc.WalletStub(channel), running, ctx, clock, topics, app)
    finally:
        await running.stop(0.5)
        await ctx.redis.aclose()
        await ctx.pool.close()
        async with await psycopg.AsyncConnection.connect(infra["DATABASE_URL"], autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def expect_error(call: Awaitable[Any], code: grpc.StatusCode, reason: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    error = info.value
    assert error.code() == code, f"{error.code()} {error.details()}"
    assert dict(error.trailing_metadata() or ()).get(REASON_METADATA_KEY) == reason, error.details()
    return error
