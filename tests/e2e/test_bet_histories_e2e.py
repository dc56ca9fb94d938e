"""Concurrent histories of bet commands on the real stack, at a table of every variant.

Players with two tasks each send random interleavings of PlaceBet, PlaceBets, CancelBet, ChangeBet
and LeaveTable, with same-id retries of what came back UNAVAILABLE or ABORTED (as the API tells
clients to retry), the same command sent twice at once, refused commands sent again, and bursts at
the betting window's edges. After every round, for every bet: the wallet's hold covered the table's
record of it when the round settled, the wallet applied the round, a settled round refunded no bet
for want of cover, the 百變 table-cap counter equals the round's live stakes, and a bet was cancelled
at most once (one BetCancelled, one fresh answer). Over the run: no answer INTERNAL or UNKNOWN, fewer
than 1 % of the commands at any table ending ABORTED or UNAVAILABLE after the retries, the money
adds up, and the audit replay (which reconciles every round of the table with the wallet) is clean.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import psycopg
import pytest
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2
from play import (
    Watcher,
    audit_replay_is_clean,
    connect,
    game_length,
    kind,
    ledger_matches_wallet,
    settle_everything,
    total_money,
)
from players import Clients, Player, all_balances, register
from psycopg import sql
from stack import Stack

from bull.variants import VARIANTS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = game_length(ci=3, full=10)
PLAYERS = 6
TASKS_PER_PLAYER = 2
DEPOSIT = 20_000_000
RETRIES = 2  # same-id retries of an UNAVAILABLE or ABORTED answer
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED)
NEVER = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
TABLES = {
    "golden_bull": {},
    "bai_buu": {},
    "baibian_bull": {"banker.min_capital_minor": "100000"},
    "red_envelope_bull": {"bidding.seconds": "2"},
}
BANKER_CAPITAL = 400_000  # a table cap of 40 000 a round: the players fill it


def table_of(variant: str, run: str) -> str:
    return f"{variant.replace('_', '-')}-{run}"


def limits() -> ev.TableLimits:
    return ev.TableLimits(
        min_bet_minor=100,
        max_bet_minor=30_000,
        chips_minor=[100],
        betting_seconds=3,
        reveal_interval_ms=5,
        pause_between_rounds_ms=100,
    )


@dataclass
class Tally:
    """What one table's commands came back with, and the cancels answered as fresh, by bet id."""

    codes: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    fresh_cancels: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)

    @property
    def commands(self) -> int:
        return sum(self.codes.values())


@dataclass
class Actor:
    """One task of a player at one table: its own command ids, its bets and its refused bets."""

    c: Clients
    p: Player
    table_id: str
    variant: str
    tally: Tally
    name: str
    rng: random.Random
    n: int = 0
    bets: list[str] = field(default_factory=list)
    refused: list[table_pb2.PlaceBetRequest] = field(default_factory=list)

    def next_id(self, what: str) -> str:
        self.n += 1
        return f"{self.name}.{what}{self.n}"

    async def call(self, rpc: Callable[..., Awaitable[Any]], request: Any) -> Any | None:
        """The call, retried with the same request while it answers UNAVAILABLE or ABORTED; None if refused."""
        for attempt in range(RETRIES + 1):
            try:
                reply = await rpc(request, metadata=self.p.auth, timeout=10)
            except grpc.aio.AioRpcError as error:
                if error.code() in RETRYABLE and attempt < RETRIES:
                    await asyncio.sleep(0.05 * (attempt + 1))
                    continue
                self.record(error)
                return None
            self.tally.codes["OK"] += 1
            return reply
        raise AssertionError("unreachable")

    def record(self, error: grpc.aio.AioRpcError) -> None:
        code = error.code()
        self.tally.codes[code.name] += 1
        self.tally.reasons[f"{code.name} {(error.details() or '').split(':')[0]}"] += 1
        if code in NEVER:
            self.tally.unexpected.append(f"{code.name}: {error.details()}")

    def bet_request(self, round_id: str) -> table_pb2.PlaceBetRequest:
        variant = VARIANTS[self.variant]
        area = self.rng.choice(variant.areas)
        fixed = variant.fixed_stake_minor(area, variant.parse_config({}))
        amount = fixed or self.rng.choice((100, 500, 1_000, 5_000, 20_000))
        return table_pb2.PlaceBetRequest(
            command_id=self.next_id("bet"), table_id=self.table_id, area=area, amount_minor=amount, round_id=round_id
        )

    async def place(self, request: table_pb2.PlaceBetRequest, twice: bool) -> None:
        sends = [self.call(self.c.table.PlaceBet, request) for _ in range(2 if twice else 1)]
        receipts = await asyncio.gather(*sends)
        if any(receipts):
            self.bets.append(request.command_id)
        else:
            self.refused.append(request)

    async def cancel(self, bet_id: str, times: int) -> None:
        request = table_pb2.CancelBetRequest(command_id=self.next_id("cancel"), table_id=self.table_id, bet_id=bet_id)
        for receipt in await asyncio.gather(*(self.call(self.c.table.CancelBet, request) for _ in range(times))):
            if receipt is not None and not receipt.replayed:
                self.tally.fresh_cancels[receipt.bet_id] += 1

    async def change(self, bet_id: str) -> None:
        async def one() -> None:
            amount = self.rng.choice((0, 200, 1_000, 3_000, 20_000))
            request = table_pb2.ChangeBetRequest(
                command_id=self.next_id("change"), table_id=self.table_id, bet_id=bet_id, amount_minor=amount
            )
            receipt = await self.call(self.c.table.ChangeBet, request)
            if receipt is not None and receipt.status == "cancelled" and not receipt.replayed:
                self.tally.fresh_cancels[receipt.bet_id] += 1

        await asyncio.gather(*(one() for _ in range(self.rng.choice((1, 1, 2)))))

    async def step(self, round_id: str) -> None:
        """One random command (or two of one kind at once)."""
        roll = self.rng.random()
        if self.bets and roll < 0.25:
            bet_id = self.rng.choice(self.bets)
            if self.variant == "red_envelope_bull" and roll < 0.15:
                await self.change(bet_id)
            else:
                await self.cancel(bet_id, self.rng.choice((1, 2, 3)))
        elif self.refused and roll < 0.35:
            await self.place(self.refused.pop(), twice=False)  # a refused bet sent again, same id
        elif roll < 0.45:
            orders = [self.bet_request(round_id) for _ in range(self.rng.choice((2, 3)))]
            reply = await self.call(self.c.table.PlaceBets, table_pb2.PlaceBetsRequest(bets=orders))
            if reply is not None:
                self.bets += [o.command_id for o, out in zip(orders, reply.outcomes, strict=True) if out.placed.bet_id]
        elif roll < 0.47:
            await self.call(self.c.table.LeaveTable, table_pb2.LeaveTableRequest(table_id=self.table_id))
        else:
            await self.place(self.bet_request(round_id), twice=roll > 0.9)

    async def play(self, round_id: str, until: float) -> None:
        """Commands until a moment after the window closes (the edge is part of the history)."""
        while time.monotonic() < until:
            await self.step(round_id)
            await asyncio.sleep(self.rng.random() * 0.05)


async def set_up(c: Clients, run: str) -> tuple[list[Player], dict[str, Player]]:
    players = [await register(c, f"h{run}p{i}", DEPOSIT) for i in range(PLAYERS)]
    staff = {role: await register(c, f"h{run}{role}", DEPOSIT) for role in ("banker", "dealer")}
    for variant, config in TABLES.items():
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(
                table_id=table_of(variant, run), variant=variant, config=config, limits=limits()
            ),
            metadata=c.admin,
        )
    await c.table.ApplyBanker(
        table_pb2.ApplyBankerRequest(table_id=table_of("baibian_bull", run), capital_minor=BANKER_CAPITAL),
        metadata=staff["banker"].auth,
    )
    return players, staff


async def betting_window(w: Watcher, after: int, dealer: Player | None) -> tuple[str, float, int]:
    """The next round's id once it takes bets, the monotonic moment its window closes, and where the
    stream was. A red-envelope round is bid for first (by ``dealer``)."""

    def opened(u: table_pb2.TableUpdate) -> bool:
        return u.position > after and kind(u) == "round_opened"

    def betting(u: table_pb2.TableUpdate) -> bool:
        return u.position > after and kind(u) == "phase_changed" and u.phase_changed.phase == "betting"

    first = await w.wait_for(opened)
    if dealer is not None:
        bid = table_pb2.PlaceBidRequest(
            command_id=f"bid.{first.round_id}", table_id=w.table_id, amount_minor=100_000, round_id=first.round_id
        )
        with contextlib.suppress(grpc.aio.AioRpcError):  # a late bid: the round is voided NO_DEALER
            await w.c.table.PlaceBid(bid, metadata=dealer.auth)
        update = await w.wait_for(lambda u: betting(u) or (u.position > first.position and opened(u)))
        deadline = update.phase_changed.deadline_unix_ms
    else:
        update, deadline = first, first.round_opened.betting_closes_at_unix_ms
    left_s = (deadline - update.server_time_unix_ms) / 1000
    return update.round_id, time.monotonic() + left_s, update.position


async def round_result(w: Watcher, round_id: str) -> str:
    update = await w.wait_for(lambda u: kind(u) == "result" and u.round_id == round_id)
    return str(update.result.status)


def table_db(stack: Stack) -> psycopg.Connection[Any]:
    conn = psycopg.connect(stack.infra["DATABASE_URL"], autocommit=True)
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(stack.schema_of("table"))))
    return conn


async def wallet_answer(c: Clients, round_id: str) -> str:
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(grpc.aio.AioRpcError):
            answer = await c.wallet.GetRoundSettlement(
                wallet_pb2.GetRoundSettlementRequest(round_id=round_id), metadata=c.admin
            )
            if answer.status:
                assert answer.status != "rejected", f"{round_id}: {answer.reason} {answer.detail}"
                return str(answer.status)
        assert time.monotonic() < deadline, f"the wallet never answered round {round_id}"
        await asyncio.sleep(0.2)


async def check_round(c: Clients, stack: Stack, round_id: str, status: str, tally: Tally) -> None:
    """The round's bets against the wallet's holds, its cap counter, and its cancels."""
    answered = await wallet_answer(c, round_id)
    with table_db(stack) as db:
        bets = db.execute(
            "SELECT bet_id, status, stake_minor, hold_minor, hold_id FROM bets WHERE round_id = %s", (round_id,)
        ).fetchall()
        cancels = db.execute(
            "SELECT stream_id, count(*) FROM events WHERE correlation_id = %s AND event_type = 'table.bet_cancelled'"
            " GROUP BY stream_id",
            (round_id,),
        ).fetchall()
        cap = db.execute("SELECT staked_minor FROM banked_rounds WHERE round_id = %s", (round_id,)).fetchone()
    assert all(n == 1 for _, n in cancels), f"{round_id}: a bet cancelled more than once: {cancels}"
    for bet_id, bet_status, stake, hold_minor, hold_id in bets:
        assert tally.fresh_cancels[bet_id] <= 1, f"bet {bet_id}: {tally.fresh_cancels[bet_id]} fresh cancels"
        hold = await c.wallet.GetHold(wallet_pb2.GetHoldRequest(hold_id=hold_id), metadata=c.admin)
        assert hold.status != wallet_pb2.HOLD_STATUS_OPEN, f"bet {bet_id}: hold {hold_id} still open"
        if bet_status == "cancelled":
            assert hold.status == wallet_pb2.HOLD_STATUS_VOIDED, (bet_id, hold)
            continue
        assert hold.amount_minor >= hold_minor, f"bet {bet_id} ({stake}): held {hold.amount_minor} < {hold_minor}"
        assert hold.resolved_by.startswith("settlement"), (bet_id, hold.resolved_by)
        if answered == "settled":
            assert bet_status == "settled", f"bet {bet_id} of a settled round is {bet_status} (not covered?)"
    if cap is not None and status == "settled":
        live = sum(stake for _, bet_status, stake, _, _ in bets if bet_status != "cancelled")
        assert cap[0] == live, f"{round_id}: the table cap counts {cap[0]}, the live stakes are {live}"


async def play_table(
    c: Clients, stack: Stack, variant: str, run: str, players: list[Player], staff: dict[str, Player]
) -> Tally:
    table_id = table_of(variant, run)
    tally = Tally()
    seed = random.Random(f"{run}{variant}")
    actors = [
        Actor(c, p, table_id, variant, tally, f"{table_id}.{p.name}.t{t}", random.Random(seed.random()))
        for p in players
        for t in range(TASKS_PER_PLAYER)
    ]
    w = Watcher(c, staff["banker"], table_id)
    dealer = staff["dealer"] if variant == "red_envelope_bull" else None
    position = 0
    try:
        for _ in range(ROUNDS):
            round_id, closes, position = await betting_window(w, position, dealer)
            await asyncio.gather(*(a.play(round_id, closes + 0.3) for a in actors))
            status = await round_result(w, round_id)
            await check_round(c, stack, round_id, status, tally)
    finally:
        await w.stop()
    return tally


async def test_concurrent_histories_keep_every_bet_and_its_hold_together(stack: Stack) -> None:
    run = stack.run_id
    async with connect(stack) as c:
        players, staff = await set_up(c, run)
        before = total_money(await all_balances(c))
        tallies = await asyncio.gather(*(play_table(c, stack, v, run, players, staff) for v in TABLES))
        for variant, tally in zip(TABLES, tallies, strict=True):
            print(variant, tally.commands, dict(tally.codes), dict(tally.reasons))  # the run's record (pytest -s)
            assert tally.unexpected == [], (variant, tally.unexpected[:5])
            assert tally.commands >= 50, (variant, tally.codes)
            lost = sum(tally.codes[code.name] for code in RETRYABLE)
            assert lost < 0.01 * tally.commands, (variant, dict(tally.codes))
        await c.table.LeaveBanker(
            table_pb2.LeaveBankerRequest(table_id=table_of("baibian_bull", run)), metadata=staff["banker"].auth
        )
        everyone = [*players, *staff.values()]
        for variant in TABLES:
            await c.table.CloseTable(table_pb2.CloseTableRequest(table_id=table_of(variant, run)), metadata=c.admin)
        await settle_everything(c, everyone)
        assert total_money(await all_balances(c)) == before
        await ledger_matches_wallet(c)
    await audit_replay_is_clean(stack)
    shown: defaultdict[str, int] = defaultdict(int)
    for tally in tallies:
        for bet_id, n in tally.fresh_cancels.items():
            shown[bet_id] += n
    assert max(shown.values(), default=0) <= 1
