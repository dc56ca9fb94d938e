"""Accounts and who may call what: register, log in, tokens, players fenced into their own account."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from niuniu.wallet.v1 import wallet_pb2 as pb
from wallet_helpers import ADMIN, AUDITOR, LEDGER, TABLE, TOKENS, Wallet, expect_error, wallet_service

from backbone.auth import Role, Tokens, bearer
from services.wallet import events
from services.wallet.domain import Role as AccountRole

pytestmark = pytest.mark.integration

DENIED = grpc.StatusCode.PERMISSION_DENIED
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


@pytest.fixture
async def wallet(infra: dict[str, str], unique: str) -> AsyncIterator[Wallet]:
    async with wallet_service(infra, unique) as w:
        yield w


async def test_register_login_profile(wallet: Wallet) -> None:
    request = pb.RegisterRequest(request_id="reg-1", username="alice", email="alice@example.org", password="s3cret-pw")
    first = await wallet.stub.Register(request)
    assert first.account == f"player:{first.account_id}"
    assert await wallet.stub.Register(request) == first  # idempotent by request id
    clash = pb.RegisterRequest(request_id="reg-1", username="alice", email="alice@example.org", password="other-pw")
    await expect_error(wallet.stub.Register(clash), grpc.StatusCode.ALREADY_EXISTS, "REQUEST_ID_REUSED")
    taken = pb.RegisterRequest(request_id="reg-2", username="alice", email="a2@example.org", password="s3cret-pw")
    await expect_error(wallet.stub.Register(taken), grpc.StatusCode.ALREADY_EXISTS, "USERNAME_TAKEN")

    stored = await wallet.sql("SELECT password_hash FROM wallet_users WHERE username = 'alice'")
    assert stored[0][0].startswith("$argon2id$")
    login = await wallet.stub.Login(pb.LoginRequest(username="alice", password="s3cret-pw"))
    assert login.role == "player" and login.account == first.account
    assert TOKENS.verify(login.token).subject == first.account_id
    profile = await wallet.stub.GetProfile(pb.GetProfileRequest(), metadata=bearer(login.token))
    assert (profile.username, profile.email, profile.account) == ("alice", "alice@example.org", first.account)
    for wrong in (
        pb.LoginRequest(username="alice", password="nope-nope"),
        pb.LoginRequest(username="bob", password="x"),
    ):
        await expect_error(wallet.stub.Login(wrong), UNAUTHENTICATED, "INVALID_CREDENTIALS")
    assert await wallet.count_events(events.ACCOUNT_OPENED) == 1


async def test_staff_accounts_come_from_the_admin_command_and_log_in(wallet: Wallet) -> None:
    admin = await wallet.app.create_staff(AccountRole.ADMIN, "root", "root@example.org", "correct-horse")
    login = await wallet.stub.Login(pb.LoginRequest(username="root", password="correct-horse"))
    assert login.role == "admin" and login.account == ""
    player = await wallet.player()
    reply = await wallet.stub.Deposit(
        pb.DepositRequest(request_id="d1", account=player.account, amount_minor=5), metadata=bearer(login.token)
    )
    assert reply.balance.available_minor == 5
    profile = await wallet.stub.GetProfile(
        pb.GetProfileRequest(account_id=player.account_id), metadata=bearer(login.token)
    )
    assert profile.role == "player"
    own = await wallet.stub.GetProfile(pb.GetProfileRequest(), metadata=bearer(login.token))
    assert own.account_id == admin.account_id


async def test_missing_malformed_forged_and_expired_tokens_are_unauthenticated(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=100)
    request = pb.GetBalanceRequest(account=player.account)
    forged = Tokens.ephemeral().issue(player.account_id, Role.ADMIN)
    expired = Tokens.development(clock=lambda: 1_000_000.0).issue(player.account_id, Role.PLAYER)
    cases = [
        ((), "TOKEN_MISSING"),
        ((("authorization", "Basic abc"),), "TOKEN_MALFORMED"),
        (bearer("not.a.jwt"), "TOKEN_INVALID"),
        (bearer(forged), "TOKEN_INVALID"),
        (bearer(expired), "TOKEN_EXPIRED"),
    ]
    for metadata, reason in cases:
        await expect_error(wallet.stub.GetBalance(request, metadata=metadata), UNAUTHENTICATED, reason)
        deposit = pb.DepositRequest(request_id="x", account=player.account, amount_minor=1)
        await expect_error(wallet.stub.Deposit(deposit, metadata=metadata), UNAUTHENTICATED, reason)
        hold = pb.PlaceHoldRequest(hold_id="x", account=player.account, amount_minor=1)
        await expect_error(wallet.stub.PlaceHold(hold, metadata=metadata), UNAUTHENTICATED, reason)
    assert await wallet.balance(player.account) == (100, 0)


async def test_a_player_cannot_read_or_move_another_players_money(wallet: Wallet) -> None:
    alice, bob = await wallet.player(deposit_minor=1_000), await wallet.player(deposit_minor=1_000)
    bob_hold = await wallet.hold(bob.account, 100)
    before = await wallet.balances()
    me = alice.metadata
    reads = [
        wallet.stub.GetBalance(pb.GetBalanceRequest(account=bob.account), metadata=me),
        wallet.stub.ListMovements(pb.ListMovementsRequest(account=bob.account), metadata=me),
        wallet.stub.ListHolds(pb.ListHoldsRequest(account=bob.account), metadata=me),
        wallet.stub.GetHold(pb.GetHoldRequest(hold_id=bob_hold.hold_id), metadata=me),
        wallet.stub.GetResponsiblePlay(pb.GetResponsiblePlayRequest(account=bob.account), metadata=me),
        wallet.stub.GetProfile(pb.GetProfileRequest(account_id=bob.account_id), metadata=me),
        wallet.stub.SetLimit(
            pb.SetLimitRequest(account=bob.account, kind=pb.LIMIT_KIND_DAILY_LOSS, value=1), metadata=me
        ),
        wallet.stub.SelfExclude(pb.SelfExcludeRequest(account=bob.account, permanent=True), metadata=me),
    ]
    for call in reads:
        await expect_error(call, DENIED, "NOT_YOUR_ACCOUNT")
    moves = [
        wallet.stub.PlaceHold(pb.PlaceHoldRequest(hold_id="mine", account=bob.account, amount_minor=1), metadata=me),
        wallet.stub.PlaceHold(pb.PlaceHoldRequest(hold_id="mine", account=alice.account, amount_minor=1), metadata=me),
        wallet.stub.PostHold(
            pb.PostHoldRequest(hold_id=bob_hold.hold_id, postings=[pb.Posting(payee=alice.account, amount_minor=100)]),
            metadata=me,
        ),
        wallet.stub.VoidHold(pb.VoidHoldRequest(hold_id=bob_hold.hold_id), metadata=me),
        wallet.stub.ResizeHold(
            pb.ResizeHoldRequest(resize_id="mine", hold_id=bob_hold.hold_id, amount_minor=1), metadata=me
        ),
        wallet.stub.Deposit(pb.DepositRequest(request_id="d", account=alice.account, amount_minor=1), metadata=me),
        wallet.stub.Withdraw(pb.WithdrawRequest(request_id="w", account=bob.account, amount_minor=1), metadata=me),
        wallet.stub.ListBalances(pb.ListBalancesRequest(), metadata=me),
        wallet.stub.GetRoundSettlement(pb.GetRoundSettlementRequest(round_id="r"), metadata=me),
    ]
    for call in moves:
        await expect_error(call, DENIED, "ROLE_NOT_ALLOWED")
    # Their own account they can read, with or without naming it.
    assert (await wallet.stub.GetBalance(pb.GetBalanceRequest(), metadata=me)).available_minor == 1_000
    assert await wallet.balances() == before


async def test_services_and_staff_reach_only_what_their_role_allows(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=1_000)
    rng = bearer(TOKENS.service_token("rng"))
    hold = pb.PlaceHoldRequest(hold_id="svc", account=player.account, amount_minor=1)
    await expect_error(wallet.stub.PlaceHold(hold, metadata=rng), DENIED, "SERVICE_NOT_ALLOWED")
    await expect_error(wallet.stub.PlaceHold(hold, metadata=LEDGER), DENIED, "SERVICE_NOT_ALLOWED")
    await expect_error(wallet.stub.PlaceHold(hold, metadata=AUDITOR), DENIED, "ROLE_NOT_ALLOWED")
    resize = pb.ResizeHoldRequest(resize_id="svc", hold_id="svc", amount_minor=2)
    await expect_error(wallet.stub.ResizeHold(resize, metadata=rng), DENIED, "SERVICE_NOT_ALLOWED")
    await expect_error(wallet.stub.ResizeHold(resize, metadata=LEDGER), DENIED, "SERVICE_NOT_ALLOWED")
    await expect_error(wallet.stub.ResizeHold(resize, metadata=AUDITOR), DENIED, "ROLE_NOT_ALLOWED")
    deposit = pb.DepositRequest(request_id="d", account=player.account, amount_minor=1)
    for metadata in (AUDITOR, TABLE, LEDGER):
        await expect_error(wallet.stub.Deposit(deposit, metadata=metadata), DENIED, "ROLE_NOT_ALLOWED")
    await expect_error(wallet.stub.ListBalances(pb.ListBalancesRequest(), metadata=rng), DENIED, "ROLE_NOT_ALLOWED")
    await expect_error(wallet.stub.ListBalances(pb.ListBalancesRequest(), metadata=TABLE), DENIED, "ROLE_NOT_ALLOWED")
    limit = pb.SetLimitRequest(account=player.account, kind=pb.LIMIT_KIND_DAILY_LOSS, value=5)
    await expect_error(wallet.stub.SetLimit(limit, metadata=AUDITOR), DENIED, "ROLE_NOT_ALLOWED")
    # What they may do:
    assert (await wallet.stub.PlaceHold(hold, metadata=ADMIN)).hold.status == pb.HOLD_STATUS_OPEN
    assert (await wallet.stub.ResizeHold(resize, metadata=ADMIN)).hold.amount_minor == 2
    assert (await wallet.stub.ResizeHold(resize, metadata=TABLE)).replayed
    for metadata in (ADMIN, AUDITOR, LEDGER):
        listed = await wallet.stub.ListBalances(pb.ListBalancesRequest(page_size=1000), metadata=metadata)
        names = {b.account for b in listed.balances}
        assert {"house", "commission_revenue", "rebate_expense", "jackpot_pool", "fees", "external:cashier"} <= names
        assert player.account in names and listed.store_position > 0
    assert (await wallet.stub.GetBalance(pb.GetBalanceRequest(account=player.account), metadata=TABLE)).held_minor == 2
    staff_token = bearer(TOKENS.issue(str(uuid.uuid4()), Role.AUDITOR))
    assert (
        await wallet.stub.GetBalance(pb.GetBalanceRequest(account="house"), metadata=staff_token)
    ).account == "house"
