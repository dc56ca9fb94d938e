"""Named regressions of hostile input and money at the edge, each against the real
four-process system: what an outsider did, and what they get now."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from niuniu.ledger.v1 import ledger_pb2
from niuniu.rng.v1 import rng_pb2, rng_pb2_grpc
from niuniu.table.v1 import events_pb2 as table_events
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2
from play import connect
from players import TOKENS, Clients, Player, all_balances, register
from stack import Stack

from backbone.auth import Role, bearer
from backbone.errors import MAX_ECHO_CHARS, MAX_MESSAGE_CHARS, REASON_METADATA_KEY, NotFound, clip
from backbone.grpcserver import MAX_RECEIVE_MESSAGE_BYTES

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
INVALID = grpc.StatusCode.INVALID_ARGUMENT
MIB = "x" * (1 << 20)


@pytest.fixture
async def c(stack: Stack) -> AsyncIterator[Clients]:
    async with connect(stack) as clients:
        yield clients


def name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


async def refused(call: Any, code: grpc.StatusCode, reason: str | None = None) -> grpc.aio.AioRpcError:
    """The call is refused with ``code`` (and ``reason``), a reason code and a bounded message."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    error = info.value
    got = dict(error.trailing_metadata() or ()).get(REASON_METADATA_KEY)
    assert error.code() == code, f"{error.code()} {got} {(error.details() or '')[:200]!r}"
    assert got is not None, error.details()
    if reason is not None:
        assert got == reason, error.details()
    assert len(error.details() or "") <= MAX_MESSAGE_CHARS
    return error


def service(role: str) -> tuple[tuple[str, str]]:
    return bearer(TOKENS.service_token(role))


async def betting_round(c: Clients, variant: str = "golden_bull") -> tuple[str, table_pb2.TableInfo]:
    table_id = name("sec-")
    limits = table_events.TableLimits(min_bet_minor=100, max_bet_minor=10_000, chips_minor=[100], betting_seconds=600)
    await c.table.CreateTable(
        table_pb2.CreateTableRequest(table_id=table_id, variant=variant, limits=limits), metadata=c.admin
    )
    deadline = time.monotonic() + 60
    while True:
        info = await c.table.GetTable(table_pb2.GetTableRequest(table_id=table_id), metadata=c.admin)
        if info.phase == "betting":
            return table_id, info
        assert time.monotonic() < deadline, "no round opened"
        await asyncio.sleep(0.2)


# ------------------------------------------------------------------------------ money at the edge


async def test_an_admin_withdrawal_never_takes_a_system_account_below_zero(c: Clients) -> None:
    """Withdrawals come from player accounts only: the jackpot pool, the house and the fees are refused
    whatever they hold, and nothing moves."""
    before = await all_balances(c)
    for account in ("jackpot_pool", "house", "fees"):
        have = before.get(account, (0, 0))[0]
        request = wallet_pb2.WithdrawRequest(request_id=name("wd-"), account=account, amount_minor=max(have, 0) + 500)
        await refused(
            c.wallet.Withdraw(request, metadata=c.admin), grpc.StatusCode.INVALID_ARGUMENT, "ACCOUNT_NOT_ALLOWED"
        )
    assert await all_balances(c) == before


async def test_a_players_command_id_is_theirs_alone(stack: Stack, c: Clients) -> None:
    alice = await register(c, name("alice"), 100_000)
    bob = await register(c, name("bob"), 100_000)
    table_id, info = await betting_round(c)

    def bet(p: Player, command_id: str, area: str) -> Any:
        request = table_pb2.PlaceBetRequest(
            command_id=command_id, table_id=table_id, area=area, amount_minor=100, round_id=info.current_round_id
        )
        return c.table.PlaceBet(request, metadata=p.auth)

    hers = await bet(alice, "cmd-1", info.areas[0])
    his = await bet(bob, "cmd-1", info.areas[1])  # the same id: bob's own bet, not ALREADY_EXISTS
    assert not hers.replayed and not his.replayed
    assert hers.bet_id != his.bet_id
    assert (await bet(alice, "cmd-1", info.areas[0])).replayed  # still alice's idempotency key
    assert (await bet(bob, "cmd-1", info.areas[1])).bet_id == his.bet_id
    await refused(bet(bob, "cmd-1", info.areas[0]), grpc.StatusCode.ALREADY_EXISTS)  # his own id, other fields
    # bob cannot cancel alice's bet by its id either.
    cancel = table_pb2.CancelBetRequest(command_id="c-1", table_id=table_id, bet_id=hers.bet_id)
    with pytest.raises(grpc.aio.AioRpcError) as info_cancel:
        await c.table.CancelBet(cancel, metadata=bob.auth)
    assert info_cancel.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)
    held = await all_balances(c)
    assert held[alice.account] == (100_000 - hers.hold_minor, hers.hold_minor)
    assert held[bob.account] == (100_000 - his.hold_minor, his.hold_minor)


async def test_a_registration_request_id_is_scoped_by_the_username(c: Clients) -> None:
    request_id = name("reg-")
    first = wallet_pb2.RegisterRequest(
        request_id=request_id, username=name("carol"), email="carol@example.org", password="carol-password"
    )
    mine = await c.wallet.Register(first)
    assert await c.wallet.Register(first) == mine  # a retry is a replay
    other = wallet_pb2.RegisterRequest(
        request_id=request_id, username=name("dave"), email="dave@example.org", password="dave-password"
    )
    theirs = await c.wallet.Register(other)  # the same id from someone else: their own account
    assert theirs.account_id != mine.account_id


async def test_a_deposit_request_id_is_scoped_by_the_admin(c: Clients) -> None:
    player = await register(c, name("erin"), 0)
    other_admin = bearer(TOKENS.issue(str(uuid.uuid4()), Role.ADMIN))
    request = wallet_pb2.DepositRequest(request_id="dep-1", account=player.account, amount_minor=300)
    first = await c.wallet.Deposit(request, metadata=c.admin)
    assert (await c.wallet.Deposit(request, metadata=c.admin)).replayed
    second = await c.wallet.Deposit(request, metadata=other_admin)  # another admin's dep-1: a deposit of its own
    assert not second.replayed and second.movement_id != first.movement_id
    assert second.balance.available_minor == 600


# ------------------------------------------------------------------------------ hostile input


@pytest.mark.parametrize("token", ["²", "①", "١٢٣", "9" * 19, "1\n", "-1"])
async def test_a_unicode_digit_page_token_is_invalid_argument(c: Clients, token: str) -> None:
    player = await register(c, name("frank"), 1_000)
    holds = wallet_pb2.ListHoldsRequest(account=player.account, page_token=token)
    moves = wallet_pb2.ListMovementsRequest(account=player.account, page_token=token)
    balances = wallet_pb2.ListBalancesRequest(page_token=token)
    statement = ledger_pb2.StatementRequest(account=player.account, page_token=token)
    await refused(c.wallet.ListHolds(holds, metadata=c.admin), INVALID, "PAGE_TOKEN_INVALID")
    await refused(c.wallet.ListMovements(moves, metadata=c.admin), INVALID, "PAGE_TOKEN_INVALID")
    await refused(c.wallet.ListBalances(balances, metadata=c.auditor), INVALID, "PAGE_TOKEN_INVALID")
    await refused(c.ledger.Statement(statement, metadata=c.auditor), INVALID, "PAGE_TOKEN_INVALID")


@pytest.mark.parametrize("expires", [2**62, 2**63 - 1, 253_402_300_800_000, -1])
async def test_a_hold_expiring_past_any_calendar_is_invalid_argument(c: Clients, expires: int) -> None:
    player = await register(c, name("gina"), 1_000)
    request = wallet_pb2.PlaceHoldRequest(
        hold_id=name("h-"), account=player.account, amount_minor=10, reason="bet", expires_at_unix_ms=expires
    )
    await refused(c.wallet.PlaceHold(request, metadata=service("table")), INVALID, "EXPIRES_AT_INVALID")
    assert (await all_balances(c))[player.account] == (1_000, 0)


async def test_a_one_mib_id_or_key_is_refused_with_a_short_message(stack: Stack, c: Clients) -> None:
    async with grpc.aio.insecure_channel(stack.addr("rng")) as channel:
        rng = rng_pb2_grpc.RngStub(channel)
        player = await register(c, name("hank"), 0)
        calls: list[Any] = [
            c.table.GetTable(table_pb2.GetTableRequest(table_id=MIB), metadata=c.admin),
            c.table.CreateTable(table_pb2.CreateTableRequest(table_id=MIB, variant="golden_bull"), metadata=c.admin),
            c.table.CreateTable(
                table_pb2.CreateTableRequest(table_id=name("t-"), variant="golden_bull", config={MIB: "1"}),
                metadata=c.admin,
            ),
            c.table.CreateTable(table_pb2.CreateTableRequest(table_id=name("t-"), variant=MIB), metadata=c.admin),
            c.table.PlaceBet(table_pb2.PlaceBetRequest(command_id=MIB, table_id="x"), metadata=player.auth),
            c.table.ListRounds(table_pb2.ListRoundsRequest(table_id=MIB), metadata=c.admin),
            c.wallet.GetHold(wallet_pb2.GetHoldRequest(hold_id=MIB), metadata=c.admin),
            c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(account=MIB), metadata=c.admin),
            c.wallet.Login(wallet_pb2.LoginRequest(username=MIB, password=MIB)),
            c.ledger.Statement(ledger_pb2.StatementRequest(account=MIB), metadata=c.auditor),
            c.ledger.RoundJournal(ledger_pb2.RoundJournalRequest(round_id=MIB), metadata=c.auditor),
            rng.GetCommitment(rng_pb2.GetCommitmentRequest(round_id=MIB), metadata=c.admin),
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            error = info.value
            assert error.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL), error.details()
            assert dict(error.trailing_metadata() or ()).get(REASON_METADATA_KEY), error.details()
            assert len(error.details() or "") <= MAX_MESSAGE_CHARS
            assert "x" * 100 not in (error.details() or "")


async def test_an_id_with_a_trailing_newline_is_refused(stack: Stack, c: Clients) -> None:
    async with grpc.aio.insecure_channel(stack.addr("rng")) as channel:
        rng = rng_pb2_grpc.RngStub(channel)
        round_id = name("r")
        await refused(rng.Commit(rng_pb2.CommitRequest(round_id=round_id + "\n"), metadata=c.admin), INVALID)
        await refused(
            rng.GetCommitment(rng_pb2.GetCommitmentRequest(round_id=round_id + "\n"), metadata=c.admin), INVALID
        )
    table_id = name("nl-")
    create = table_pb2.CreateTableRequest(table_id=table_id + "\n", variant="golden_bull")
    await refused(c.table.CreateTable(create, metadata=c.admin), INVALID)
    lookup = c.table.GetTable(table_pb2.GetTableRequest(table_id=table_id + "\n"), metadata=c.admin)
    await refused(lookup, grpc.StatusCode.NOT_FOUND, "TABLE_NOT_FOUND")  # no table can have that name
    listed = await c.table.ListTables(table_pb2.ListTablesRequest(), metadata=c.admin)
    assert not [t.table_id for t in listed.tables if "\n" in t.table_id]
    player = await register(c, name("ivy"), 1_000)
    hold = wallet_pb2.PlaceHoldRequest(hold_id=name("h-") + "\n", account=player.account, amount_minor=10, reason="bet")
    await refused(c.wallet.PlaceHold(hold, metadata=service("table")), INVALID, "HOLD_ID_INVALID")
    deposit = wallet_pb2.DepositRequest(request_id="d\n", account=player.account, amount_minor=10)
    await refused(c.wallet.Deposit(deposit, metadata=c.admin), INVALID, "REQUEST_ID_INVALID")


async def test_a_nul_character_in_any_text_is_invalid_argument(stack: Stack, c: Clients) -> None:
    """PostgreSQL cannot store a NUL: GetTable, Login, Register, ... answered INTERNAL."""
    player = await register(c, name("jack"), 1_000)
    calls: list[Any] = [
        c.table.GetTable(table_pb2.GetTableRequest(table_id="\x00"), metadata=c.admin),
        c.table.ListRounds(table_pb2.ListRoundsRequest(table_id="t\x00"), metadata=c.admin),
        c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=name("t-"), variant="golden_bull", config={"a\x00": "1"}),
            metadata=c.admin,
        ),
        c.wallet.Login(wallet_pb2.LoginRequest(username="\x00", password="whatever-password")),
        c.wallet.Register(
            wallet_pb2.RegisterRequest(
                request_id=name("r-"), username=name("kim"), email="kim@example.org\x00", password="kim-password"
            )
        ),
        c.wallet.PostHold(
            wallet_pb2.PostHoldRequest(hold_id="h-1", postings=[wallet_pb2.Posting(payee="house\x00", amount_minor=1)]),
            metadata=service("table"),
        ),
        c.ledger.Statement(ledger_pb2.StatementRequest(account=player.account + "\x00"), metadata=c.auditor),
        c.ledger.RoundJournal(ledger_pb2.RoundJournalRequest(round_id="r\x00"), metadata=c.auditor),
    ]
    before = await all_balances(c)
    for call in calls:
        await refused(call, INVALID)
    assert await all_balances(c) == before


def test_error_messages_are_bounded_and_echo_little() -> None:
    error = NotFound("TABLE_NOT_FOUND", f"no table {'a' * 129} at {'b' * 2000}")
    assert len(str(error)) <= MAX_MESSAGE_CHARS
    assert "a" * 81 not in str(error) and "b" * 81 not in str(error)
    assert len(str(NotFound("X", "y " * 10_000))) <= MAX_MESSAGE_CHARS
    assert clip("r1\n") == "'r1\\n'"  # a control character is shown, not sent
    assert len(clip("x" * 10_000)) == MAX_ECHO_CHARS and clip("x" * 10_000).endswith("…")


async def test_the_rounds_of_an_unknown_table_are_not_found(c: Clients) -> None:
    unknown = table_pb2.ListRoundsRequest(table_id=name("nowhere-"))
    await refused(c.table.ListRounds(unknown, metadata=c.admin), grpc.StatusCode.NOT_FOUND, "TABLE_NOT_FOUND")


async def test_servers_refuse_a_request_above_their_bound(stack: Stack, c: Clients) -> None:
    huge = "x" * (MAX_RECEIVE_MESSAGE_BYTES + 1024)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await c.wallet.GetHold(wallet_pb2.GetHoldRequest(hold_id=huge), metadata=c.admin)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    # And the server is still there for everyone else.
    assert (await c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(account="house"), metadata=c.admin)).account


def test_no_id_pattern_is_matched_with_a_dollar_anchor() -> None:
    """``re.match(r"...$")`` accepts a trailing newline: patterns are matched whole (fullmatch or \\Z)."""
    offenders = []
    for path in sorted([*ROOT.glob("backbone/**/*.py"), *ROOT.glob("bull/**/*.py"), *ROOT.glob("services/**/*.py")]):
        text = path.read_text()
        for match in re.finditer(r"""re\.compile\(\s*r?["']([^"']*)["']""", text):
            if match.group(1).endswith("$") and not match.group(1).endswith("\\$"):
                offenders.append(f"{path.relative_to(ROOT)}: {match.group(1)}")
        for match in re.finditer(r"""re\.(?:match|search)\(\s*r?["']([^"']*)\$["']""", text):
            offenders.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert offenders == []
