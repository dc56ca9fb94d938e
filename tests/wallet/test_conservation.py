"""Money is conserved: a Hypothesis property over random sequences of wallet operations on the real service.

After any sequence of deposits, withdrawals, holds, resizes, posts, voids and settlements
(and replays of them, and bad input):

- every balance is what a simple model predicts;
- the sum over ALL accounts (available + held, system accounts and external:cashier
  included) is zero, so the sum over the non-external accounts equals deposits minus
  withdrawals (external:cashier holds exactly minus that);
- no player's available or held is below zero, and held equals the player's open holds;
- every account's entries, and the legs of every wallet event, add up to its balance
  (what the ledger rebuilds).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import defaultdict
from collections.abc import Coroutine, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from niuniu.wallet.v1 import events_pb2 as wallet_events
from niuniu.wallet.v1 import wallet_pb2 as pb
from wallet_helpers import ADMIN, CASHIER, TABLE, Wallet, settled, transfer, wallet_service

from services.wallet.settlement import ROUND_SETTLED

pytestmark = pytest.mark.integration

T = TypeVar("T")
PLAYERS = 3
HOUSE = PLAYERS  # account index 3 is the house


class LoopThread:
    """One event loop in a thread, so a synchronous Hypothesis test can drive the async service."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def service(infra: dict[str, str]) -> Iterator[tuple[LoopThread, Wallet]]:
    runner = LoopThread()
    stack = AsyncExitStack()
    wallet = runner.run(stack.enter_async_context(wallet_service(infra, uuid.uuid4().hex[:12], sweep_interval_s=5)))
    try:
        yield runner, wallet
    finally:
        runner.run(stack.aclose())
        runner.close()


@dataclass
class Hold:
    hold_id: str
    account: str
    amount: int
    open: bool = True
    # (payee, amount) when a PostHold resolved it: the same post again is an idempotent repeat.
    posted: tuple[str, int] | None = None


@dataclass
class Model:
    balances: dict[str, list[int]]
    accounts: list[str]
    holds: list[Hold] = field(default_factory=list)
    last_settlement: Any = None

    def move(self, payer: tuple[str, int], payee: tuple[str, int], amount: int) -> None:
        self.balances[payer[0]][payer[1]] -= amount
        self.balances[payee[0]][payee[1]] += amount


AVAILABLE, HELD = 0, 1
account_index = st.integers(0, PLAYERS)  # a player, or the house
player_index = st.integers(0, PLAYERS - 1)
amount = st.integers(1, 5_000)
pick = st.integers(0, 1_000)  # picks among the holds made so far
percent = st.integers(0, 100)
hold_op = st.tuples(st.just("hold"), player_index, st.integers(1, 3_000))
settle_op = st.tuples(
    st.just("settle"),
    st.lists(st.tuples(pick, percent, account_index), min_size=1, max_size=3),
    st.integers(0, 500),
    player_index,
    st.integers(0, 150),  # percent of its credits a paid player pays on without a hold (> 100: refused)
)
operations = st.one_of(
    st.tuples(st.just("deposit"), account_index, amount),
    st.tuples(st.just("withdraw"), account_index, amount),
    hold_op,
    hold_op,
    st.tuples(st.just("resize"), pick, st.integers(1, 3_000)),
    st.tuples(st.just("post"), pick, percent, account_index),
    st.tuples(st.just("void"), pick),
    settle_op,
    settle_op,
    st.tuples(st.just("replay")),
    st.tuples(st.just("bad"), player_index),
)


async def run_ops(wallet: Wallet, ops: list[tuple[Any, ...]]) -> None:
    players = [await wallet.player() for _ in range(PLAYERS)]
    balances = await wallet.balances()
    model = Model(
        defaultdict(lambda: [0, 0], {a: list(b) for a, b in balances.items()}),
        [p.account for p in players] + ["house"],
    )
    for player in players:  # start with money, so holds mostly succeed
        await apply(wallet, model, ("deposit", model.accounts.index(player.account), 5_000))
    for op in ops:
        await apply(wallet, model, op)
    await check(wallet, model)


async def apply(wallet: Wallet, model: Model, op: tuple[Any, ...]) -> None:
    name = op[0]
    s = wallet.stub
    if name == "deposit":
        account = model.accounts[op[1]]
        ok = account != "house"  # only a player's money comes in from the cashier
        cash_in = pb.DepositRequest(request_id=uuid.uuid4().hex, account=account, amount_minor=op[2])
        await expect(s.Deposit(cash_in, metadata=ADMIN), ok)
        if ok:
            model.move((CASHIER, AVAILABLE), (account, AVAILABLE), op[2])
    elif name == "withdraw":
        account, value = model.accounts[op[1]], op[2]
        request = pb.WithdrawRequest(request_id=uuid.uuid4().hex, account=account, amount_minor=value)
        # Only a player's money goes out, never below zero (settlements may take the house below it).
        ok = account != "house" and model.balances[account][AVAILABLE] >= value
        await expect(s.Withdraw(request, metadata=ADMIN), ok)
        if ok:
            model.move((account, AVAILABLE), (CASHIER, AVAILABLE), value)
    elif name == "hold":
        account, value = model.accounts[op[1]], op[2]
        ok = model.balances[account][AVAILABLE] >= value
        hold_id = f"h-{uuid.uuid4().hex}"
        place = pb.PlaceHoldRequest(hold_id=hold_id, account=account, amount_minor=value, reason="bet")
        await expect(s.PlaceHold(place, metadata=TABLE), ok)
        if ok:
            model.move((account, AVAILABLE), (account, HELD), value)
            model.holds.append(Hold(hold_id, account, value))
    elif name == "resize" and model.holds:
        hold, value = model.holds[op[1] % len(model.holds)], op[2]
        change = value - hold.amount
        ok = hold.open and change <= model.balances[hold.account][AVAILABLE]
        resize = pb.ResizeHoldRequest(resize_id=uuid.uuid4().hex, hold_id=hold.hold_id, amount_minor=value)
        await expect(s.ResizeHold(resize, metadata=TABLE), ok)
        if ok:
            model.move((hold.account, AVAILABLE), (hold.account, HELD), change)
            hold.amount = value
    elif name == "post" and model.holds:
        hold = model.holds[op[1] % len(model.holds)]
        take, payee = hold.amount * op[2] // 100, model.accounts[op[3]]
        if take == 0 or payee == hold.account:
            return
        posting = pb.Posting(payee=payee, amount_minor=take)
        repeat = hold.posted == (payee, take)  # answered with the first resolution, nothing moves
        await expect(
            s.PostHold(pb.PostHoldRequest(hold_id=hold.hold_id, postings=[posting]), metadata=TABLE),
            hold.open or repeat,
        )
        if hold.open:
            model.move((hold.account, HELD), (payee, AVAILABLE), take)
            model.move((hold.account, HELD), (hold.account, AVAILABLE), hold.amount - take)
            hold.open = False
            hold.posted = (payee, take)
    elif name == "void" and model.holds:
        hold = model.holds[op[1] % len(model.holds)]
        reply = await s.VoidHold(pb.VoidHoldRequest(hold_id=hold.hold_id), metadata=TABLE) if hold.open else None
        if reply is not None:
            model.move((hold.account, HELD), (hold.account, AVAILABLE), hold.amount)
            hold.open = False
    elif name == "settle":
        await settle(wallet, model, op[1], op[2], model.accounts[op[3]], op[4])
    elif name == "replay" and model.last_settlement is not None:
        await wallet.feed(model.last_settlement)  # the same event again: nothing moves
    elif name == "bad":
        account = model.accounts[op[1]]
        bad = pb.DepositRequest(request_id=uuid.uuid4().hex, account=account, amount_minor=-1)
        await expect(s.Deposit(bad, metadata=ADMIN), False)


async def settle(
    wallet: Wallet, model: Model, picks: list[tuple[int, int, int]], payout: int, winner: str, onward: int
) -> None:
    round_id = f"r-{uuid.uuid4().hex}"
    transfers, hold_ids = [], []
    moves: list[tuple[tuple[str, int], tuple[str, int], int]] = []
    credits: dict[str, int] = defaultdict(int)  # what the settlement paid each account so far
    for index, share, payee_index in picks:
        if not model.holds:
            break
        hold = model.holds[index % len(model.holds)]
        if not hold.open or hold.hold_id in hold_ids:
            continue
        hold_ids.append(hold.hold_id)
        take, payee = hold.amount * share // 100, model.accounts[payee_index]
        if payee == hold.account:
            payee = "house"
        if take:
            transfers.append(transfer(hold.account, payee, take, "loss", hold.hold_id))
            moves.append(((hold.account, HELD), (payee, AVAILABLE), take))
            credits[payee] += take
        moves.append(((hold.account, HELD), (hold.account, AVAILABLE), hold.amount - take))
    if payout:
        transfers.append(transfer("house", winner, payout, "win"))
        moves.append((("house", AVAILABLE), (winner, AVAILABLE), payout))
        credits[winner] += payout
    # A paid player pays on without a hold; past what the settlement paid it, nothing applies.
    paid = next((a for a in sorted(credits) if a.startswith("player:") and credits[a]), None)
    refused = False
    if paid is not None and onward:
        amount = max(1, credits[paid] * onward // 100)
        transfers.append(transfer(paid, "house", amount, "fee"))
        moves.append(((paid, AVAILABLE), ("house", AVAILABLE), amount))
        refused = amount > credits[paid]
    applied = await wallet.settle_direct(ROUND_SETTLED, settled(round_id, transfers, hold_ids), round_id)
    status = await wallet.sql("SELECT status, reason FROM wallet_rounds WHERE round_id = %s", round_id)
    if refused:
        assert status == [("rejected", "PAYER_NOT_SYSTEM")]
        return
    assert status == [("settled", "")]
    model.last_settlement = applied
    for source, target, amount in moves:
        model.move(source, target, amount)
    for hold in model.holds:
        hold.open = hold.open and hold.hold_id not in hold_ids


async def expect(call: Any, ok: bool) -> None:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        assert not ok, error.details()
        assert error.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT), error
        return
    assert ok, "the wallet accepted what the model refuses"


MOVEMENT_FIELDS: dict[str, tuple[type[Any], str]] = {
    "wallet.deposited": (wallet_events.Deposited, "movement"),
    "wallet.withdrawn": (wallet_events.Withdrawn, "movement"),
    "wallet.hold_placed": (wallet_events.HoldPlaced, "movement"),
    "wallet.hold_resized": (wallet_events.HoldResized, "movement"),
    "wallet.hold_voided": (wallet_events.HoldVoided, "movement"),
    "wallet.hold_posted": (wallet_events.HoldPosted, "movements"),
    "wallet.round_settlement_applied": (wallet_events.RoundSettlementApplied, "movements"),
}


async def legs_by_account(wallet: Wallet) -> dict[str, list[int]]:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    async with wallet.ctx.pool.connection() as conn:
        stored = await wallet.ctx.store.read_all(conn, 0, 1_000_000)
    for stored_event in stored:
        if stored_event.event_type not in MOVEMENT_FIELDS:
            continue
        cls, attr = MOVEMENT_FIELDS[stored_event.event_type]
        payload = cls()
        stored_event.unpack(payload)
        found = getattr(payload, attr)
        for movement in [found] if attr == "movement" else list(found):
            assert sum(leg.amount_minor for leg in movement.legs) == 0, movement
            for leg in movement.legs:
                totals[leg.account][0 if leg.bucket == wallet_events.BUCKET_AVAILABLE else 1] += leg.amount_minor
    return totals


async def check(wallet: Wallet, model: Model) -> None:
    listed = await wallet.balances()
    assert {a: tuple(b) for a, b in model.balances.items() if a in listed or any(b)} == listed
    assert sum(av + held for av, held in listed.values()) == 0
    outside = sum(av + held for account, (av, held) in listed.items() if not account.startswith("external:"))
    assert outside == -listed[CASHIER][AVAILABLE]
    rows = await wallet.sql(
        "SELECT coalesce(sum(available_delta) FILTER (WHERE source = 'deposit'), 0),"
        " coalesce(-sum(available_delta) FILTER (WHERE source = 'withdrawal'), 0)"
        " FROM wallet_entries WHERE account <> %s",
        CASHIER,
    )
    deposits, withdrawals = int(rows[0][0]), int(rows[0][1])
    assert outside == deposits - withdrawals
    for account, (av, held) in listed.items():
        if account.startswith("player:"):
            assert av >= 0 and held >= 0
            open_holds = sum(h.amount for h in model.holds if h.account == account and h.open)
            assert held == open_holds or account not in model.accounts
    entries = await wallet.sql(
        "SELECT account, sum(available_delta), sum(held_delta) FROM wallet_entries GROUP BY account"
    )
    assert {a: (int(x), int(y)) for a, x, y in entries if x or y} == {a: b for a, b in listed.items() if any(b)}
    legs = await legs_by_account(wallet)
    assert {a: tuple(b) for a, b in legs.items() if any(b)} == {a: b for a, b in listed.items() if any(b)}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(operations, min_size=1, max_size=25))
def test_money_is_conserved_over_any_sequence_of_operations(service: tuple[LoopThread, Wallet], ops: list[Any]) -> None:
    runner, wallet = service
    event(f"settlements naming holds: {min(2, sum(1 for op in ops if op[0] == 'settle' and op[1]))}")
    runner.run(run_ops(wallet, ops))
