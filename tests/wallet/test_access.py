"""Accounts and who may call what: register, log in, tokens, players fenced into their own account."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import pytest
from niuniu.wallet.v1 import wallet_pb2 as pb
from redis.asyncio import Redis
from wallet_helpers import ADMIN, AUDITOR, LEDGER, TABLE, TOKENS, Wallet, expect_error, wallet_service

from backbone.auth import Role, Tokens, bearer
from services.wallet import events
from services.wallet import throttle as throttle_module
from services.wallet.domain import Role as AccountRole
from services.wallet.throttle import (
    RETRY_AFTER_METADATA_KEY,
    Limit,
    Throttle,
    ThrottlePolicy,
    TooManyAttempts,
    client_address,
)

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
    reads: list[Awaitable[object]] = [
        wallet.stub.GetBalance(pb.GetBalanceRequest(account=bob.account), metadata=me),
        wallet.stub.ListMovements(pb.ListMovementsRequest(account=bob.account), metadata=me),
        wallet.stub.ListHolds(pb.ListHoldsRequest(account=bob.account), metadata=me),
        wallet.stub.GetResponsiblePlay(pb.GetResponsiblePlayRequest(account=bob.account), metadata=me),
        wallet.stub.GetProfile(pb.GetProfileRequest(account_id=bob.account_id), metadata=me),
        wallet.stub.SetLimit(
            pb.SetLimitRequest(account=bob.account, kind=pb.LIMIT_KIND_DAILY_LOSS, value=1), metadata=me
        ),
        wallet.stub.SelfExclude(pb.SelfExcludeRequest(account=bob.account, permanent=True), metadata=me),
    ]
    for call in reads:
        await expect_error(call, DENIED, "NOT_YOUR_ACCOUNT")
    moves: list[Awaitable[object]] = [
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


async def test_a_players_get_hold_answers_alike_for_another_players_hold_and_for_none(wallet: Wallet) -> None:
    """Another player's hold and a hold that does not exist get the same NOT_FOUND, word for word:
    a player cannot learn which hold ids exist. Staff and the table still read any hold."""
    alice, bob = await wallet.player(deposit_minor=1_000), await wallet.player(deposit_minor=1_000)
    mine, theirs = await wallet.hold(alice.account, 100), await wallet.hold(bob.account, 100)
    missing = f"h-{uuid.uuid4().hex}"  # shaped like theirs

    async def answer(hold_id: str) -> tuple[grpc.StatusCode, str, str]:
        error = await expect_error(
            wallet.stub.GetHold(pb.GetHoldRequest(hold_id=hold_id), metadata=alice.metadata),
            grpc.StatusCode.NOT_FOUND,
            "HOLD_NOT_FOUND",
        )
        return error.code(), (error.details() or "").replace(hold_id, "<id>"), str(error.trailing_metadata())

    assert await answer(theirs.hold_id) == await answer(missing)
    own = await wallet.stub.GetHold(pb.GetHoldRequest(hold_id=mine.hold_id), metadata=alice.metadata)
    assert (own.account, own.amount_minor) == (alice.account, 100)
    for staff in (ADMIN, AUDITOR, TABLE):
        hold = await wallet.stub.GetHold(pb.GetHoldRequest(hold_id=theirs.hold_id), metadata=staff)
        assert hold.account == bob.account
    # A role that may read no hold is refused before the lookup: the same answer whether it exists or not.
    ledger = [await expect_error(wallet.stub.GetHold(pb.GetHoldRequest(hold_id=h), metadata=LEDGER), DENIED,
                                 "ROLE_NOT_ALLOWED") for h in (theirs.hold_id, missing)]  # fmt: skip
    assert ledger[0].details() == ledger[1].details()


async def test_a_players_get_holds_leaves_out_another_players_holds_as_unknown_ones(wallet: Wallet) -> None:
    """GetHolds for a player: their own holds only; another player's is left out exactly as an id
    that does not exist, so the answer says nothing of which ids exist. Staff and the table read any."""
    alice, bob = await wallet.player(deposit_minor=1_000), await wallet.player(deposit_minor=1_000)
    mine, theirs = await wallet.hold(alice.account, 100), await wallet.hold(bob.account, 100)
    missing = f"h-{uuid.uuid4().hex}"

    async def read(metadata: Any, *ids: str) -> list[tuple[str, str]]:
        reply = await wallet.stub.GetHolds(pb.GetHoldsRequest(hold_ids=list(ids)), metadata=metadata)
        return sorted((h.hold_id, h.account) for h in reply.holds)

    assert await read(alice.metadata, mine.hold_id, theirs.hold_id) == [(mine.hold_id, alice.account)]
    assert await read(alice.metadata, mine.hold_id, theirs.hold_id) == await read(alice.metadata, mine.hold_id, missing)
    assert await read(alice.metadata, theirs.hold_id) == []
    for staff in (ADMIN, AUDITOR, TABLE):
        assert await read(staff, mine.hold_id, theirs.hold_id, missing) == sorted(
            [(mine.hold_id, alice.account), (theirs.hold_id, bob.account)]
        )
    for refused in (LEDGER, bearer(TOKENS.service_token("rng"))):
        await expect_error(
            wallet.stub.GetHolds(pb.GetHoldsRequest(hold_ids=[theirs.hold_id]), metadata=refused),
            DENIED,
            "ROLE_NOT_ALLOWED",
        )


async def test_services_and_staff_reach_only_what_their_role_allows(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=1_000)
    rng = bearer(TOKENS.service_token("rng"))
    hold = pb.PlaceHoldRequest(hold_id="svc", account=player.account, amount_minor=1)
    await expect_error(wallet.stub.PlaceHold(hold, metadata=rng), DENIED, "SERVICE_NOT_ALLOWED")
    await expect_error(wallet.stub.PlaceHold(hold, metadata=LEDGER), DENIED, "SERVICE_NOT_ALLOWED")
    await expect_error(wallet.stub.PlaceHold(hold, metadata=AUDITOR), DENIED, "ROLE_NOT_ALLOWED")
    holds = pb.PlaceHoldsRequest(holds=[hold])
    await expect_error(wallet.stub.PlaceHolds(holds, metadata=rng), DENIED, "SERVICE_NOT_ALLOWED")
    await expect_error(wallet.stub.PlaceHolds(holds, metadata=LEDGER), DENIED, "SERVICE_NOT_ALLOWED")
    await expect_error(wallet.stub.PlaceHolds(holds, metadata=AUDITOR), DENIED, "ROLE_NOT_ALLOWED")
    await expect_error(wallet.stub.PlaceHolds(holds, metadata=player.metadata), DENIED, "ROLE_NOT_ALLOWED")
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


# ------------------------------------------------------------------- throttling Login and Register


async def inside_one_window(window_s: int, needed_s: float = 20.0) -> None:
    """Wait, if need be, until the throttle's fixed window (aligned to the epoch) has ``needed_s`` left, so
    that the calls a test counts all fall in one window (across a boundary the count starts again)."""
    left = window_s - time.time() % window_s
    if left < needed_s:
        await asyncio.sleep(left + 0.05)


async def expect_throttled(call: Awaitable[Any]) -> int:
    """RESOURCE_EXHAUSTED TOO_MANY_ATTEMPTS; returns the retry-after seconds from the trailing metadata."""
    error = await expect_error(call, grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_ATTEMPTS")
    assert "retry in" in (error.details() or "")
    trailers = dict(error.trailing_metadata() or ())
    return int(trailers[RETRY_AFTER_METADATA_KEY])


async def test_login_is_throttled_per_account_even_with_the_right_password(infra: dict[str, str], unique: str) -> None:
    async with wallet_service(infra, unique, throttle=ThrottlePolicy()) as wallet:  # the production defaults
        for name in ("alice", "bob"):
            await wallet.stub.Register(
                pb.RegisterRequest(request_id=f"r-{name}", username=name, email=f"{name}@x.org", password="right-pw-1")
            )
        limit = ThrottlePolicy().account_failures.attempts
        for _ in range(limit):
            wrong = pb.LoginRequest(username="alice", password="wrong-pw-1")
            await expect_error(wallet.stub.Login(wrong), UNAUTHENTICATED, "INVALID_CREDENTIALS")
        retry_s = await expect_throttled(wallet.stub.Login(pb.LoginRequest(username="alice", password="right-pw-1")))
        assert 0 < retry_s <= ThrottlePolicy().account_failures.window_s
        # Another account from the same address is not locked by alice's failures.
        assert (await wallet.stub.Login(pb.LoginRequest(username="bob", password="right-pw-1"))).token


async def test_login_and_register_are_throttled_per_address(infra: dict[str, str], unique: str) -> None:
    policy = ThrottlePolicy(
        account_failures=Limit(100, 60), address_failures=Limit(3, 60), address_attempts=Limit(1_000, 60)
    )
    async with wallet_service(infra, unique, throttle=policy) as wallet:
        await inside_one_window(60)
        await wallet.stub.Register(
            pb.RegisterRequest(request_id="r-carol", username="carol", email="carol@x.org", password="right-pw-1")
        )
        for name in ("u1", "u2", "u3"):  # guessing across accounts
            await expect_error(
                wallet.stub.Login(pb.LoginRequest(username=name, password="guess-pw-1")),
                UNAUTHENTICATED,
                "INVALID_CREDENTIALS",
            )
        await expect_throttled(wallet.stub.Login(pb.LoginRequest(username="carol", password="right-pw-1")))
        register = pb.RegisterRequest(request_id="r-dave", username="dave", email="dave@x.org", password="right-pw-1")
        await expect_throttled(wallet.stub.Register(register))
        assert await wallet.count_events(events.ACCOUNT_OPENED) == 1  # dave was not registered

    attempts = ThrottlePolicy(address_attempts=Limit(3, 60))
    async with wallet_service(infra, f"{unique}b", throttle=attempts) as wallet:
        await inside_one_window(60)
        for n in range(3):
            await wallet.stub.Register(
                pb.RegisterRequest(request_id=f"r{n}", username=f"user{n}", email=f"u{n}@x.org", password="right-pw-1")
            )
        await expect_throttled(
            wallet.stub.Register(
                pb.RegisterRequest(request_id="r9", username="user9", email="u9@x.org", password="right-pw-1")
            )
        )


async def test_without_redis_the_throttle_counts_in_a_bounded_local_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis is a coordinator: unreachable, the limits still hold per instance, in bounded memory."""
    monkeypatch.setattr(throttle_module, "LOCAL_CAPACITY", 50)
    unreachable = Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    limiter = Throttle(unreachable, ThrottlePolicy(account_failures=Limit(2, 60)))
    try:
        for _ in range(2):
            await limiter.admit("alice", "ipv4:10.0.0.1")
            await limiter.failed("alice", "ipv4:10.0.0.1")
        with pytest.raises(TooManyAttempts):
            await limiter.admit("alice", "ipv4:10.0.0.2")
        for n in range(200):  # many identities: the table stays bounded
            await limiter.failed(f"user{n}" * 1000, f"ipv4:10.1.{n}.1")
        assert len(limiter._local) <= 50
    finally:
        await unreachable.aclose()


def test_client_address_drops_the_port() -> None:
    assert client_address("ipv4:10.1.2.3:5555") == "ipv4:10.1.2.3"
    assert client_address("ipv6:[::1]:5555") == "ipv6:[::1]"
    assert client_address("unix:/tmp/s") == "unix:/tmp/s"
