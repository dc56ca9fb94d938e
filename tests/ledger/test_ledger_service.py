"""The ledger on the real stack: wallet-shaped events -> Kafka -> journal -> gRPC and the audit replay."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
import psycopg
import pytest
from niuniu.ledger.v1 import ledger_pb2, ledger_pb2_grpc
from niuniu.wallet.v1 import events_pb2 as wallet_pb2
from prometheus_client import REGISTRY
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from backbone.auth import Role, Tokens, bearer
from backbone.config import Settings
from backbone.db import open_pool
from backbone.eventstore import EventStore, NewEvent
from backbone.grpcserver import RunningServer
from backbone.kafka import make_producer
from backbone.relay import OutboxRelay
from backbone.service import ServiceContext, start
from backbone.topics import Topics
from services.ledger import audit, audit_replay, metrics
from services.ledger.audit_config import AuditConfig
from services.ledger.reconcile import WalletBalance
from services.ledger.server import SPEC, imbalance_watch
from services.ledger.synthetic import AVAILABLE, HELD, SyntheticStream, leg, movement
from tests.harness import migrate

pytestmark = pytest.mark.integration

CATCH_UP_S = 60.0
TOKENS = Tokens.development()
AUDITOR = bearer(TOKENS.issue("auditor-1", Role.AUDITOR))


@dataclass
class Stack:
    prefix: str
    topics: Topics
    ledger_schema: str
    running: RunningServer
    ctx: ServiceContext
    wallet_pool: AsyncConnectionPool
    wallet: EventStore
    table: EventStore
    stub: ledger_pb2_grpc.LedgerAsyncStub
    published: int = 0

    async def emit(self, items: Sequence[tuple[str, str, NewEvent]]) -> None:
        """Append (target, stream id, event) through the wallet's / table's event store and publish them."""
        async with self.wallet_pool.connection() as conn, conn.transaction():
            for target, stream_id, event in items:
                store = self.wallet if target == "wallet" else self.table
                version = await store.stream_version(conn, stream_id)
                await store.append(conn, stream_id, version, [event])
        relay = OutboxRelay("wallet", self.wallet_pool, make_producer(self.ctx.settings.kafka_bootstrap_servers, "t"))
        while published := await relay.publish_once():
            self.published += published

    async def caught_up(self) -> None:
        deadline = time.monotonic() + CATCH_UP_S
        while time.monotonic() < deadline:
            async with self.ctx.pool.connection() as conn:
                cur = await conn.execute("SELECT count(*) FROM processed_events")
                row = await cur.fetchone()
            if row and row[0] >= self.published:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"the ledger did not apply {self.published} events within {CATCH_UP_S}s")

    def audit_args(self, *extra: str) -> list[str]:
        settings = self.ctx.settings
        return [
            "--dsn",
            settings.dsn,
            "--schema",
            self.ledger_schema,
            "--kafka",
            settings.kafka_bootstrap_servers,
            "--topic-prefix",
            self.prefix,
            *extra,
        ]


@pytest.fixture
async def stack(dsn: str, kafka_servers: str, redis_url: str, schema: str, unique: str) -> AsyncIterator[Stack]:
    prefix = f"t{unique}."
    topics = Topics(prefix)
    ledger_schema = f"l_{unique}"
    settings = Settings("ledger", dsn, kafka_servers, redis_url, grpc_port=0, metrics_port=0)
    await migrate(SPEC, dsn, ledger_schema)
    running, ctx = await start(SPEC, settings, topics, schema=ledger_schema, tokens=TOKENS)
    wallet_pool = await open_pool(dsn, schema=schema, max_size=4)
    wallet = EventStore("wallet", topics.wallet_events)
    async with wallet_pool.connection() as conn:
        await wallet.setup(conn)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    yield Stack(
        prefix,
        topics,
        ledger_schema,
        running,
        ctx,
        wallet_pool,
        wallet,
        EventStore("table", topics.table_events),
        ledger_pb2_grpc.LedgerStub(channel),
    )
    await channel.close()
    await running.stop(1.0)
    await ctx.redis.aclose()
    await ctx.pool.close()
    await wallet_pool.close()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(ledger_schema)))


async def run_audit(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = await asyncio.to_thread(audit.main, list(argv), out=out, err=io.StringIO())
    return code, out.getvalue()


async def synthetic(stack: Stack, events: int, seed: int = 11) -> SyntheticStream:
    stream = SyntheticStream(seed=seed, players=5)
    await stack.emit([(s.target, s.stream_id, s.event) for s in stream.events(events)])
    await stack.caught_up()
    return stream


async def test_journal_balances_matches_the_stream_and_replays_identically(stack: Stack) -> None:
    stream = await synthetic(stack, 160)

    trial = await stack.stub.TrialBalance(ledger_pb2.TrialBalanceRequest(), metadata=AUDITOR)
    assert trial.imbalance_minor == 0 and trial.total_debit_minor == trial.total_credit_minor > 0
    ledger = {(r.account, "held" if r.bucket == HELD else "available"): r.balance_minor for r in trial.rows}
    assert {k: v for k, v in ledger.items() if v} == {k: v for k, v in stream.expected.items() if v}
    past = await stack.stub.TrialBalance(ledger_pb2.TrialBalanceRequest(as_of_position=10), metadata=AUDITOR)
    assert past.imbalance_minor == 0 and past.last_wallet_position <= 10 and 0 < past.entries < trial.entries

    # A player's statement, paged: running balances end at the closing balance, which is the stream's.
    player = stream.players[0]
    own = bearer(TOKENS.issue(player.removeprefix("player:"), Role.PLAYER))
    lines: list[ledger_pb2.StatementLine] = []
    token = ""
    while True:
        page = await stack.stub.Statement(
            ledger_pb2.StatementRequest(account=player, page_size=7, page_token=token), metadata=own
        )
        lines.extend(page.lines)
        if not (token := page.next_page_token):
            break
    assert page.closing_available_minor == stream.expected[(player, "available")]
    assert lines[-1].available_after_minor == page.closing_available_minor and len(lines) > 7
    assert len({line.entry_id + str(line.bucket) for line in lines}) == len(lines)

    # The round's journal comes with the table's settlement.
    round_id = stream.rounds[0]
    journal = await stack.stub.RoundJournal(ledger_pb2.RoundJournalRequest(round_id=round_id), metadata=AUDITOR)
    assert journal.status == "settled" and journal.settlement.round_id == round_id and journal.entries
    assert all(sum(x.debit_minor for x in e.lines) == sum(x.credit_minor for x in e.lines) for e in journal.entries)

    code, report = await run_audit("verify-round", round_id, "--no-recompute", *stack.audit_args())
    assert code == audit.EXIT_OK, report
    code, report = await run_audit("replay", *stack.audit_args("--no-wallet", "--no-progress"))
    assert code == audit.EXIT_OK, report
    assert "differences: 0" in report and "imbalance 0" in report
    # Replayed by two worker processes, a share of the partitions each: the same journal, compared as strictly.
    code, by_two = await run_audit("replay", "--workers", "2", *stack.audit_args("--no-wallet", "--no-progress"))
    assert code == audit.EXIT_OK, by_two
    assert _journal_lines(by_two) == _journal_lines(report) and "differences: 0" in by_two

    # The wallet comparison, against a fake balance source holding the stream's balances
    # (the wallet service's ListBalances is not available yet).
    fake = {
        account: WalletBalance(stream.expected[(account, "available")], stream.expected[(account, "held")])
        for account in stream.players
    }
    config = AuditConfig(
        stack.ctx.settings.dsn,
        stack.ctx.settings.kafka_bootstrap_servers,
        stack.topics,
        stack.ledger_schema,
        f"r_{stack.ledger_schema}",
    )
    assert (await audit_replay.audit_replay(config, FakeWallet(fake))).differences == []
    fake[player] = WalletBalance(fake[player].available_minor + 1, 0)
    (difference,) = (await audit_replay.audit_replay(config, FakeWallet(fake))).differences
    assert difference.subject == f"{player}/available" and difference.other == str(fake[player].available_minor)


def _journal_lines(report: str) -> list[str]:
    """The report's lines about what was replayed and compared (not its timings or scratch names)."""
    kept = ("journal", "trial", "rejects", "rounds", "differences")
    lines = [line for line in report.splitlines() if line.lstrip().startswith(kept)]
    assert len(lines) >= 4, report
    return lines


class FakeWallet:
    def __init__(self, balances: dict[str, WalletBalance]) -> None:
        self._balances = balances

    async def balances(self) -> dict[str, WalletBalance]:
        return dict(self._balances)

    async def published_below(self) -> int:
        return 0  # does not say: the audit judges by Kafka's partitions


async def test_an_altered_journal_row_is_caught_by_the_replay(stack: Stack) -> None:
    await synthetic(stack, 40)
    async with stack.ctx.pool.connection() as conn:
        cur = await conn.execute(
            'SELECT entry_id, account FROM journal_lines WHERE credit_minor > 0 ORDER BY entry_id COLLATE "C" LIMIT 1'
        )
        row = await cur.fetchone()
        assert row is not None
        tampered, tampered_account = str(row[0]), str(row[1])
        with pytest.raises(psycopg.errors.RestrictViolation):  # the journal is append-only
            await conn.execute(
                "UPDATE journal_lines SET credit_minor = credit_minor + 1 WHERE entry_id = %s", (tampered,)
            )
        await conn.rollback()
        async with conn.transaction():
            await conn.execute("ALTER TABLE journal_lines DISABLE TRIGGER journal_lines_append_only")
            await conn.execute(
                "UPDATE journal_lines SET credit_minor = credit_minor + 1 WHERE entry_id = %s AND credit_minor > 0",
                (tampered,),
            )
            await conn.execute("ALTER TABLE journal_lines ENABLE TRIGGER journal_lines_append_only")

    for workers in ("1", "2"):  # in this process, and by two worker processes
        code, report = await run_audit(
            "replay", "--workers", workers, *stack.audit_args("--no-wallet", "--no-progress")
        )
        assert code == audit.EXIT_DIFFERENCES, report
        assert f"[journal] entry {tampered}: line" in report
        assert "[trial_balance] live journal" in report  # and the live totals no longer balance
        assert f"[balances] live {tampered_account}/" in report  # nor match the balances table


async def journal_rejects_gauge(stack: Stack) -> float | None:
    """One round of the ledger's imbalance watch, then niuniu_ledger_journal_rejects."""
    metrics.JOURNAL_REJECTS.set(-1)  # not a count: the watch's first round replaces it
    stop = asyncio.Event()
    watching = asyncio.create_task(imbalance_watch(stack.ctx)(stop))
    try:
        for _ in range(100):
            if REGISTRY.get_sample_value("niuniu_ledger_journal_rejects") != -1:
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await watching
    return REGISTRY.get_sample_value("niuniu_ledger_journal_rejects")


async def test_an_unbalanced_movement_is_rejected_and_reported(stack: Stack) -> None:
    await synthetic(stack, 20)
    bad = movement("bad-1", "loss", leg("player:p0", HELD, -100), leg("house", AVAILABLE, 90), round_id="r-bad")
    good = movement("good-1", "deposit", leg("external:cashier", AVAILABLE, -5), leg("player:p0", AVAILABLE, 5))
    applied = wallet_pb2.RoundSettlementApplied(round_id="r-bad", movements=[bad, good])
    await stack.emit([("wallet", "settlement-r-bad", NewEvent("wallet.round_settlement_applied", applied, "r-bad"))])
    await stack.caught_up()

    journal = await stack.stub.RoundJournal(ledger_pb2.RoundJournalRequest(round_id="r-bad"), metadata=AUDITOR)
    assert [e.entry_id for e in journal.entries] == ["good-1"]
    (reject,) = journal.rejects
    assert reject.entry_id == "bad-1" and reject.reason == "UNBALANCED" and "sum to -10" in reject.detail
    trial = await stack.stub.TrialBalance(ledger_pb2.TrialBalanceRequest(), metadata=AUDITOR)
    assert trial.imbalance_minor == 0
    assert await journal_rejects_gauge(stack) == 1  # the alert's latch: it stays while the reject is kept

    code, report = await run_audit("replay", *stack.audit_args("--no-wallet", "--no-progress"))
    assert code == audit.EXIT_DIFFERENCES, report
    assert "[rejects] entry bad-1" in report and "UNBALANCED" in report


async def test_roles_and_bad_input(stack: Stack) -> None:
    stub = stack.stub
    other = bearer(TOKENS.issue("p1", Role.PLAYER))
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await stub.Statement(ledger_pb2.StatementRequest(account="player:p2"), metadata=other)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await stub.TrialBalance(ledger_pb2.TrialBalanceRequest(), metadata=other)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stub.TrialBalance(ledger_pb2.TrialBalanceRequest())
    assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
    for request, reason in (
        (ledger_pb2.StatementRequest(account="casino"), "ACCOUNT_INVALID"),
        (ledger_pb2.StatementRequest(account="house", page_size=-1), "PAGE_SIZE_INVALID"),
        (ledger_pb2.StatementRequest(account="house", page_token="garbage!"), "PAGE_TOKEN_INVALID"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.Statement(request, metadata=AUDITOR)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and reason in str(bad.value.details())
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await stub.RoundJournal(ledger_pb2.RoundJournalRequest(), metadata=AUDITOR)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await stub.TrialBalance(ledger_pb2.TrialBalanceRequest(as_of_position=-3), metadata=AUDITOR)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    unknown = await stub.RoundJournal(ledger_pb2.RoundJournalRequest(round_id="nope"), metadata=AUDITOR)
    assert unknown.status == "unknown" and not unknown.entries
