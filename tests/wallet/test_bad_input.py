"""Bad input gets INVALID_ARGUMENT or NOT_FOUND with a reason, never UNKNOWN, and changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from niuniu.wallet.v1 import wallet_pb2 as pb
from wallet_helpers import ADMIN, TABLE, Wallet, expect_error, wallet_service

pytestmark = pytest.mark.integration

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
NOBODY = "player:00000000-0000-4000-8000-000000000000"
TOO_MUCH = 10**15 + 1
WALLET = "/niuniu.wallet.v1.Wallet"


@pytest.fixture
async def wallet(infra: dict[str, str], unique: str) -> AsyncIterator[Wallet]:
    async with wallet_service(infra, unique) as w:
        yield w


async def snapshot(wallet: Wallet) -> tuple[Any, ...]:
    counts = await wallet.sql(
        "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM wallet_holds),"
        " (SELECT count(*) FROM wallet_entries), (SELECT count(*) FROM wallet_users),"
        " (SELECT count(*) FROM wallet_limits), (SELECT count(*) FROM wallet_exclusions),"
        " (SELECT count(*) FROM wallet_hold_resizes)"
    )
    return await wallet.balances(), counts


async def test_bad_input_is_refused_with_a_reason_and_changes_nothing(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=1_000)
    hold = await wallet.hold(player.account, 100)
    me = player.metadata
    before = await snapshot(wallet)
    s = wallet.stub

    def deposit(account: str = player.account, amount: int = 10, request_id: str = "d-1") -> Any:
        return s.Deposit(pb.DepositRequest(request_id=request_id, account=account, amount_minor=amount), metadata=ADMIN)

    def place(**fields: Any) -> Any:
        request = pb.PlaceHoldRequest(hold_id="h-new", account=player.account, amount_minor=10, reason="bet")
        for name, value in fields.items():
            setattr(request, name, value)
        return s.PlaceHold(request, metadata=TABLE)

    def post(hold_id: str = hold.hold_id, *postings: tuple[str, int]) -> Any:
        items = [pb.Posting(payee=p, amount_minor=a) for p, a in postings]
        return s.PostHold(pb.PostHoldRequest(hold_id=hold_id, postings=items), metadata=TABLE)

    def resize(hold_id: str = hold.hold_id, amount: int = 50, resize_id: str = "rs-1") -> Any:
        request = pb.ResizeHoldRequest(resize_id=resize_id, hold_id=hold_id, amount_minor=amount)
        return s.ResizeHold(request, metadata=TABLE)

    past = int((wallet.clock().timestamp() - 60) * 1000)
    far = int((wallet.clock().timestamp() + 8 * 86400) * 1000)
    cases: list[tuple[Any, grpc.StatusCode, str]] = [
        (deposit(amount=0), INVALID, "AMOUNT_NOT_POSITIVE"),
        (deposit(amount=-5), INVALID, "AMOUNT_NOT_POSITIVE"),
        (deposit(amount=TOO_MUCH), INVALID, "AMOUNT_TOO_LARGE"),
        (deposit(account=""), INVALID, "ACCOUNT_INVALID"),
        (deposit(account="player:not-a-uuid"), INVALID, "ACCOUNT_INVALID"),
        (deposit(account="player:00000000-0000-4000-8000-00000000000A"), INVALID, "ACCOUNT_INVALID"),
        (deposit(account="casino"), INVALID, "ACCOUNT_INVALID"),
        (deposit(account=NOBODY), NOT_FOUND, "ACCOUNT_NOT_FOUND"),
        (deposit(account="external:cashier"), INVALID, "ACCOUNT_NOT_ALLOWED"),
        (deposit(request_id=""), INVALID, "REQUEST_ID_INVALID"),
        (deposit(request_id="has space"), INVALID, "REQUEST_ID_INVALID"),
        (deposit(request_id="x" * 129), INVALID, "REQUEST_ID_INVALID"),
        (
            s.Withdraw(pb.WithdrawRequest(request_id="w", account=player.account, amount_minor=0), metadata=ADMIN),
            INVALID,
            "AMOUNT_NOT_POSITIVE",
        ),
        (
            s.Withdraw(pb.WithdrawRequest(request_id="w", account=player.account, amount_minor=901), metadata=ADMIN),
            grpc.StatusCode.FAILED_PRECONDITION,
            "INSUFFICIENT_FUNDS",
        ),
        (place(hold_id=""), INVALID, "HOLD_ID_INVALID"),
        (place(hold_id="bad id"), INVALID, "HOLD_ID_INVALID"),
        (place(account="house"), INVALID, "ACCOUNT_NOT_HOLDABLE"),
        (place(account="player:xyz"), INVALID, "ACCOUNT_INVALID"),
        (place(account=NOBODY), NOT_FOUND, "ACCOUNT_NOT_FOUND"),
        (place(amount_minor=0), INVALID, "AMOUNT_NOT_POSITIVE"),
        (place(amount_minor=TOO_MUCH), INVALID, "AMOUNT_TOO_LARGE"),
        (place(round_id="round with spaces"), INVALID, "ROUND_ID_INVALID"),
        (place(reason="x" * 201), INVALID, "REASON_INVALID"),
        (place(expires_at_unix_ms=past), INVALID, "EXPIRES_AT_INVALID"),
        (place(expires_at_unix_ms=far), INVALID, "EXPIRES_AT_INVALID"),
        (place(expires_at_unix_ms=-1), INVALID, "EXPIRES_AT_INVALID"),
        (place(amount_minor=901), grpc.StatusCode.FAILED_PRECONDITION, "INSUFFICIENT_FUNDS"),
        (post(hold.hold_id), INVALID, "POSTINGS_EMPTY"),
        (post("no-such-hold", ("house", 1)), NOT_FOUND, "HOLD_NOT_FOUND"),
        (post("", ("house", 1)), INVALID, "HOLD_ID_INVALID"),
        (post(hold.hold_id, ("house", 0)), INVALID, "AMOUNT_NOT_POSITIVE"),
        (post(hold.hold_id, ("house", 101)), INVALID, "POSTINGS_EXCEED_HOLD"),
        (post(hold.hold_id, ("house", 60), ("fees", 41)), INVALID, "POSTINGS_EXCEED_HOLD"),
        (post(hold.hold_id, ("external:cashier", 1)), INVALID, "PAYEE_INVALID"),
        (post(hold.hold_id, (player.account, 1)), INVALID, "PAYEE_INVALID"),
        (post(hold.hold_id, (NOBODY, 1)), NOT_FOUND, "ACCOUNT_NOT_FOUND"),
        (post(hold.hold_id, ("nobody", 1)), INVALID, "ACCOUNT_INVALID"),
        (resize(amount=0), INVALID, "AMOUNT_NOT_POSITIVE"),
        (resize(amount=-1), INVALID, "AMOUNT_NOT_POSITIVE"),
        (resize(amount=TOO_MUCH), INVALID, "AMOUNT_TOO_LARGE"),
        (resize(resize_id=""), INVALID, "RESIZE_ID_INVALID"),
        (resize(resize_id="bad id"), INVALID, "RESIZE_ID_INVALID"),
        (resize(hold_id=""), INVALID, "HOLD_ID_INVALID"),
        (resize(hold_id="no-such-hold"), NOT_FOUND, "HOLD_NOT_FOUND"),
        (resize(amount=1_001), grpc.StatusCode.FAILED_PRECONDITION, "INSUFFICIENT_FUNDS"),
        (s.VoidHold(pb.VoidHoldRequest(hold_id="missing"), metadata=TABLE), NOT_FOUND, "HOLD_NOT_FOUND"),
        (s.VoidHold(pb.VoidHoldRequest(hold_id=""), metadata=TABLE), INVALID, "HOLD_ID_INVALID"),
        (s.GetHold(pb.GetHoldRequest(hold_id="a/b"), metadata=TABLE), INVALID, "HOLD_ID_INVALID"),
        (s.GetBalance(pb.GetBalanceRequest(account=NOBODY), metadata=ADMIN), NOT_FOUND, "ACCOUNT_NOT_FOUND"),
        (s.GetBalance(pb.GetBalanceRequest(), metadata=ADMIN), INVALID, "ACCOUNT_REQUIRED"),
        (s.ListMovements(pb.ListMovementsRequest(page_token="abc"), metadata=me), INVALID, "PAGE_TOKEN_INVALID"),
        (s.ListMovements(pb.ListMovementsRequest(page_size=-1), metadata=me), INVALID, "PAGE_SIZE_INVALID"),
        (s.ListMovements(pb.ListMovementsRequest(page_size=5000), metadata=me), INVALID, "PAGE_SIZE_INVALID"),
        (s.ListHolds(pb.ListHoldsRequest(page_token="-1"), metadata=me), INVALID, "PAGE_TOKEN_INVALID"),
        (s.ListBalances(pb.ListBalancesRequest(page_token="zz"), metadata=ADMIN), INVALID, "PAGE_TOKEN_INVALID"),
        (s.SetLimit(pb.SetLimitRequest(value=5), metadata=me), INVALID, "LIMIT_KIND_INVALID"),
        (
            s.SetLimit(pb.SetLimitRequest(kind=pb.LIMIT_KIND_DAILY_LOSS, value=-1), metadata=me),
            INVALID,
            "LIMIT_INVALID",
        ),
        (
            s.SetLimit(pb.SetLimitRequest(kind=pb.LIMIT_KIND_DAILY_LOSS, value=TOO_MUCH), metadata=me),
            INVALID,
            "LIMIT_INVALID",
        ),
        (
            s.SetLimit(pb.SetLimitRequest(account="house", kind=pb.LIMIT_KIND_DAILY_LOSS, value=1), metadata=ADMIN),
            INVALID,
            "ACCOUNT_NOT_PLAYER",
        ),
        (s.SelfExclude(pb.SelfExcludeRequest(days=0), metadata=me), INVALID, "DAYS_INVALID"),
        (s.SelfExclude(pb.SelfExcludeRequest(days=-3), metadata=me), INVALID, "DAYS_INVALID"),
        (s.SelfExclude(pb.SelfExcludeRequest(days=100_000), metadata=me), INVALID, "DAYS_INVALID"),
        (
            s.GetRoundSettlement(pb.GetRoundSettlementRequest(round_id="nope"), metadata=ADMIN),
            NOT_FOUND,
            "ROUND_NOT_FOUND",
        ),
        (s.GetRoundSettlement(pb.GetRoundSettlementRequest(), metadata=ADMIN), INVALID, "ROUND_ID_INVALID"),
        (s.GetProfile(pb.GetProfileRequest(account_id="42"), metadata=ADMIN), INVALID, "ACCOUNT_ID_INVALID"),
        (
            s.Register(pb.RegisterRequest(request_id="r", username="x", email="x@example.org", password="longenough")),
            INVALID,
            "USERNAME_INVALID",
        ),
        (
            s.Register(pb.RegisterRequest(request_id="r", username="xavier", email="nope", password="longenough")),
            INVALID,
            "EMAIL_INVALID",
        ),
        (
            s.Register(pb.RegisterRequest(request_id="r", username="xavier", email="x@example.org", password="short")),
            INVALID,
            "PASSWORD_INVALID",
        ),
        (
            s.Register(pb.RegisterRequest(username="xavier", email="x@example.org", password="longenough")),
            INVALID,
            "REQUEST_ID_INVALID",
        ),
    ]
    for call, code, reason in cases:
        await expect_error(call, code, reason)
    assert await snapshot(wallet) == before


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])


def field(number: int, value: int | bytes) -> bytes:
    """One field on the wire, encoded by hand: a varint as given (however wide), or length-delimited bytes."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


async def test_an_integer_that_overflowed_on_the_wire_is_refused_not_truncated(wallet: Wallet) -> None:
    """Protobuf keeps the low 64 bits of a wider varint (and the low 32 of an int32): 2^64 + 5 would
    arrive as 5. The server refuses such a request before any handler sees it."""
    player = await wallet.player(deposit_minor=1_000)
    before = await snapshot(wallet)
    account = player.account.encode()
    deposit = field(1, b"d-overflow") + field(2, account) + field(3, 2**64 + 5)
    assert pb.DepositRequest.FromString(deposit).amount_minor == 5  # what the handler would have seen
    nested = field(1, field(1, b"h-overflow") + field(2, account) + field(3, 2**64 + 5) + field(4, b"bet"))
    assert pb.PlaceHoldsRequest.FromString(nested).holds[0].amount_minor == 5
    page = field(2, 2**32 + 10)  # ListMovementsRequest.page_size, an int32
    assert pb.ListMovementsRequest.FromString(page).page_size == 10
    calls = [
        ("Deposit", deposit, ADMIN, "amount_minor"),
        ("PlaceHolds", nested, TABLE, "holds.amount_minor"),
        ("ListMovements", page, player.metadata, "page_size"),
    ]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{wallet.running.port}") as channel:
        for method, raw, metadata, name in calls:
            unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(f"{WALLET}/{method}")
            call = unary(raw, metadata=metadata)
            error = await expect_error(call, INVALID, "INTEGER_OVERFLOW")
            assert name in (error.details() or ""), error.details()
        # The same bytes with a value that fits pass: 2^63 - 1 is too much money, not an overflow.
        fits = field(1, b"d-fits") + field(2, account) + field(3, 2**63 - 1)
        deposit_raw: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(f"{WALLET}/Deposit")
        call = deposit_raw(fits, metadata=ADMIN)
        await expect_error(call, INVALID, "AMOUNT_TOO_LARGE")
    assert await snapshot(wallet) == before
