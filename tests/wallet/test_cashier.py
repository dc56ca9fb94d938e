"""The cashier: an operator's payment integration funds players (Deposit/Withdraw) and does nothing else."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf.message import Message
from niuniu.wallet.v1 import wallet_pb2 as pb
from psycopg import sql
from wallet_helpers import ADMIN, SYSTEM, TABLE, TOKENS, Wallet, expect_error, wallet_service

from backbone.auth import Role, bearer
from backbone.migrations import migration_ids
from services.wallet import admin, events
from services.wallet.domain import CASHIER
from tools.migrate import FOLDERS, migrate

pytestmark = pytest.mark.integration

DENIED = grpc.StatusCode.PERMISSION_DENIED
# The calls a cashier may make besides logging in; every other Wallet RPC refuses its token.
CASHIER_CALLS = {"Deposit", "Withdraw"}
OPEN_CALLS = {"Register", "Login"}  # no token needed


@pytest.fixture
async def wallet(infra: dict[str, str], unique: str) -> AsyncIterator[Wallet]:
    async with wallet_service(infra, unique) as w:
        yield w


async def cashier_login(
    wallet: Wallet, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[str, pb.LoginResponse]:
    """A cashier made with the operator command (python -m services.wallet.admin), logged in through the wallet."""
    password = tmp_path / "password"
    password.write_text("cashier-pass-1\n")
    # The database and schema wallet_service runs in (the tool prefers NIUNIU_WALLET_DSN to DATABASE_URL).
    monkeypatch.setenv("NIUNIU_WALLET_DSN", wallet.ctx.settings.dsn)
    monkeypatch.setenv("NIUNIU_DB_SCHEMA", f"w_{unique}")
    argv = ["create", "--role", "cashier", "--username", "payments", "--email", "payments@example.org"]
    capsys.readouterr()
    assert await asyncio.to_thread(admin.main, [*argv, "--password-file", str(password)]) == 0
    account_id = capsys.readouterr().out.strip()
    login = await wallet.stub.Login(pb.LoginRequest(username="payments", password="cashier-pass-1"))
    return account_id, login


def deposit(request_id: str, account: str, amount_minor: int) -> pb.DepositRequest:
    return pb.DepositRequest(request_id=request_id, account=account, amount_minor=amount_minor)


def withdraw(request_id: str, account: str, amount_minor: int) -> pb.WithdrawRequest:
    return pb.WithdrawRequest(request_id=request_id, account=account, amount_minor=amount_minor)


async def test_a_cashier_deposits_and_withdraws_for_players_idempotently(
    wallet: Wallet, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    account_id, login = await cashier_login(wallet, unique, tmp_path, monkeypatch, capsys)
    assert (login.role, login.account_id, login.account) == ("cashier", account_id, "")
    principal = TOKENS.verify(login.token)
    assert (principal.role, principal.subject) == (Role.CASHIER, account_id)
    cashier = bearer(login.token)
    player = await wallet.player()

    first = await wallet.stub.Deposit(deposit("psp-tx-1", player.account, 10_000), metadata=cashier)
    assert (first.balance.account, first.balance.available_minor, first.replayed) == (player.account, 10_000, False)
    assert await wallet.balance(player.account) == (10_000, 0)
    assert first.movement_id == f"deposit:{account_id}:psp-tx-1"  # the payment system's id, recorded
    # A retry (the integration timed out, say) replays the first answer and moves nothing.
    again = await wallet.stub.Deposit(deposit("psp-tx-1", player.account, 10_000), metadata=cashier)
    assert (again.movement_id, again.balance, again.replayed) == (first.movement_id, first.balance, True)
    await expect_error(
        wallet.stub.Deposit(deposit("psp-tx-1", player.account, 9_999), metadata=cashier),
        grpc.StatusCode.ALREADY_EXISTS,
        "REQUEST_ID_REUSED",
    )
    # Request ids are the caller's own: an admin's "psp-tx-1" is another deposit.
    other = await wallet.stub.Deposit(deposit("psp-tx-1", player.account, 500), metadata=ADMIN)
    assert other.movement_id != first.movement_id and other.balance.available_minor == 10_500
    assert await wallet.balance(player.account) == (10_500, 0)

    out = await wallet.stub.Withdraw(withdraw("psp-out-1", player.account, 4_000), metadata=cashier)
    assert (out.balance.available_minor, out.replayed) == (6_500, False)
    replay = await wallet.stub.Withdraw(withdraw("psp-out-1", player.account, 4_000), metadata=cashier)
    assert (replay.movement_id, replay.balance.available_minor, replay.replayed) == (out.movement_id, 6_500, True)
    await expect_error(
        wallet.stub.Withdraw(withdraw("psp-out-2", player.account, 6_501), metadata=cashier),
        grpc.StatusCode.FAILED_PRECONDITION,
        "INSUFFICIENT_FUNDS",
    )
    assert await wallet.balance(player.account) == (6_500, 0)

    # The player's own history shows both, as deposit and withdrawal movements.
    history = await wallet.stub.ListMovements(pb.ListMovementsRequest(), metadata=player.metadata)
    seen = {(m.movement_id, m.kind, m.available_delta_minor) for m in history.movements}
    assert {(first.movement_id, "deposit", 10_000), (out.movement_id, "withdrawal", -4_000)} <= seen
    # Each is one event naming the cashier as its actor; the ledger journals them balanced.
    assert await wallet.count_events(events.DEPOSITED) == 2  # the cashier's and the admin's
    assert await wallet.count_events(events.WITHDRAWN) == 1
    journal = await wallet.journal()
    funded = [e for e in journal if e.kind == "deposit" and any(line.account == player.account for line in e.lines)]
    assert len(funded) == 2
    for entry in funded:
        assert sum(line.debit_minor for line in entry.lines) == sum(line.credit_minor for line in entry.lines)
        assert {line.account for line in entry.lines} == {player.account, CASHIER}
    await wallet.ledger_agrees()


async def test_a_cashier_reaches_only_player_accounts(
    wallet: Wallet, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, login = await cashier_login(wallet, unique, tmp_path, monkeypatch, capsys)
    cashier = bearer(login.token)
    before = await wallet.balances()
    # Nor may an admin, but to seed the jackpot pool: the other system accounts move only through settlements.
    await wallet.deposit("jackpot_pool", 1_000)
    for account in SYSTEM:
        error = await expect_error(
            wallet.stub.Withdraw(withdraw(f"w-{account}", account, 100), metadata=ADMIN),
            grpc.StatusCode.INVALID_ARGUMENT,
            "ACCOUNT_NOT_ALLOWED",
        )
        assert f"{account} is a system account" in (error.details() or "")
        if account != "jackpot_pool":
            error = await expect_error(
                wallet.stub.Deposit(deposit(f"d-{account}", account, 100), metadata=ADMIN),
                grpc.StatusCode.INVALID_ARGUMENT,
                "ACCOUNT_NOT_ALLOWED",
            )
            assert f"{account} is a system account" in (error.details() or "")
    for account in (*SYSTEM, CASHIER):
        for call in (
            wallet.stub.Deposit(deposit(f"d-{account}", account, 100), metadata=cashier),
            wallet.stub.Withdraw(withdraw(f"w-{account}", account, 100), metadata=cashier),
        ):
            error = await expect_error(call, DENIED, "PLAYER_ACCOUNTS_ONLY")
            assert "player accounts" in (error.details() or "")
    await expect_error(
        wallet.stub.Deposit(deposit("d-bad", "player:not-a-uuid", 100), metadata=cashier),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ACCOUNT_INVALID",
    )
    await expect_error(
        wallet.stub.Deposit(deposit("d-nobody", f"player:{uuid.uuid4()}", 100), metadata=cashier),
        grpc.StatusCode.NOT_FOUND,
        "ACCOUNT_NOT_FOUND",
    )
    balances = await wallet.balances()
    seeded = {"jackpot_pool": (before["jackpot_pool"][0] + 1_000, before["jackpot_pool"][1])}
    assert {a: balances[a] for a in SYSTEM} == {a: before[a] for a in SYSTEM} | seeded


async def test_a_cashier_token_opens_no_other_wallet_call_and_players_cannot_fund_themselves(
    wallet: Wallet, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    account_id, login = await cashier_login(wallet, unique, tmp_path, monkeypatch, capsys)
    cashier = bearer(login.token)
    player = await wallet.player(deposit_minor=1_000)
    hold = await wallet.hold(player.account, 100)
    # Every Wallet RPC but Deposit/Withdraw (and the token-less Register/Login) refuses a cashier,
    # with requests that would otherwise be valid: no balance, history, hold, limit or profile.
    requests: dict[str, Message] = {
        "GetProfile": pb.GetProfileRequest(account_id=player.account_id),
        "GetBalance": pb.GetBalanceRequest(account=player.account),
        "ListHolds": pb.ListHoldsRequest(account=player.account),
        "ListMovements": pb.ListMovementsRequest(account=player.account),
        "GetHold": pb.GetHoldRequest(hold_id=hold.hold_id),
        "GetHolds": pb.GetHoldsRequest(hold_ids=[hold.hold_id]),
        "ListBalances": pb.ListBalancesRequest(),
        "GetResponsiblePlay": pb.GetResponsiblePlayRequest(account=player.account),
        "SetLimit": pb.SetLimitRequest(account=player.account, kind=pb.LIMIT_KIND_DAILY_DEPOSIT, value=1),
        "SelfExclude": pb.SelfExcludeRequest(account=player.account, days=1),
        "PlaceHold": pb.PlaceHoldRequest(
            hold_id=f"h-{uuid.uuid4().hex}", account=player.account, amount_minor=10, reason="bet"
        ),
        "PlaceHolds": pb.PlaceHoldsRequest(
            holds=[pb.PlaceHoldRequest(hold_id=f"h-{uuid.uuid4().hex}", account=player.account, amount_minor=10)]
        ),
        "PostHold": pb.PostHoldRequest(hold_id=hold.hold_id),
        "VoidHold": pb.VoidHoldRequest(hold_id=hold.hold_id),
        "ResizeHold": pb.ResizeHoldRequest(resize_id=f"rs-{uuid.uuid4().hex}", hold_id=hold.hold_id, amount_minor=50),
        "GetRoundSettlement": pb.GetRoundSettlementRequest(round_id=f"r-{uuid.uuid4().hex}"),
    }
    service = pb.DESCRIPTOR.services_by_name["Wallet"]
    assert set(service.methods_by_name) == set(requests) | CASHIER_CALLS | OPEN_CALLS, "a new RPC: decide for cashiers"
    for name, request in requests.items():
        call: Any = getattr(wallet.stub, name)
        await expect_error(call(request, metadata=cashier), DENIED, "ROLE_NOT_ALLOWED")
    assert await wallet.balance(player.account) == (900, 100)  # the hold untouched, nothing limited
    play = await wallet.stub.GetResponsiblePlay(pb.GetResponsiblePlayRequest(), metadata=player.metadata)
    assert not play.self_excluded and all(limit.value == 0 for limit in play.limits)

    # A player cannot fund themselves, nor does a cashier's subject pass for a player's.
    await expect_error(
        wallet.stub.Deposit(deposit("self", player.account, 1), metadata=player.metadata), DENIED, "ROLE_NOT_ALLOWED"
    )
    await expect_error(
        wallet.stub.Withdraw(withdraw("self", player.account, 1), metadata=player.metadata), DENIED, "ROLE_NOT_ALLOWED"
    )
    as_player = bearer(TOKENS.issue(account_id, Role.PLAYER))  # the cashier's id in a player's token
    await expect_error(
        wallet.stub.Deposit(deposit("p", player.account, 1), metadata=as_player), DENIED, "ROLE_NOT_ALLOWED"
    )
    # Nor can a service's token (the table's).
    await expect_error(wallet.stub.Deposit(deposit("t", player.account, 1), metadata=TABLE), DENIED, "ROLE_NOT_ALLOWED")
    assert await wallet.balance(player.account) == (900, 100)


async def test_a_wallet_created_before_the_cashier_role_accepts_cashiers_after_migrating(dsn: str, schema: str) -> None:
    """The wallet's baseline migration widens the old role check of an existing wallet_users table."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        await conn.execute(
            """
            CREATE TABLE wallet_users (
                account_id UUID PRIMARY KEY, username TEXT NOT NULL UNIQUE, email TEXT NOT NULL,
                password_hash TEXT NOT NULL,
                role TEXT NOT NULL CHECK (role IN ('player', 'admin', 'auditor')),
                request_id TEXT UNIQUE, created_at TIMESTAMPTZ NOT NULL
            )
            """
        )
        insert = "INSERT INTO wallet_users VALUES (%s, %s, 'x@example.org', 'h', %s, NULL, now())"
        with pytest.raises(psycopg.errors.CheckViolation):
            await conn.execute(insert, (uuid.uuid4(), "early", "cashier"))
        assert await asyncio.to_thread(migrate, "wallet", dsn, schema) == migration_ids(FOLDERS["wallet"])
        await conn.execute(insert, (uuid.uuid4(), "payments", "cashier"))
        with pytest.raises(psycopg.errors.CheckViolation):
            await conn.execute(insert, (uuid.uuid4(), "nobody", "croupier"))
