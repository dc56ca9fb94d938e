"""Bot players for the chaos run: every variant played through the table's gRPC API.

Each ``TableBots`` watches its table (``WatchTable``, resuming from its last position after
any failure), records every update it receives with the time it arrived (the checks read
them: results for the stalls, cards for "nothing before its reveal") and reacts:
Golden Bull and Bai Buu bots bet on random areas when a round opens; at a 百變牛牛 table one
bot keeps applying for the banker seat and the others bet; at a 68 NiuNiu table one bot
bids for the dealer seat and the others bet against the dealer once it is chosen. Every
call has a deadline; any refusal is counted by status code and play goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2, table_pb2_grpc
from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc

from backbone.auth import bearer
from bull.rules import bai_buu as bu
from bull.rules import baibian_bull as bb
from bull.rules import golden_bull as gb

VARIANTS = ("golden_bull", "baibian_bull", "bai_buu", "red_envelope_bull")
CALL_TIMEOUT_S = 5.0
DEPOSIT_MINOR = 5_000_000
LIMITS = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=1_000_000,
    chips_minor=[100],
    betting_seconds=2,
    reveal_interval_ms=10,
    pause_between_rounds_ms=200,
)
CONFIG = {"red_envelope_bull": {"bidding.seconds": "2"}}
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.CANCELLED,
}
T = TypeVar("T")


def kind(update: table_pb2.TableUpdate) -> str:
    return update.WhichOneof("update") or ""


@dataclass
class Player:
    name: str
    password: str
    account: str = ""
    token: str = ""

    @property
    def auth(self) -> tuple[tuple[str, str]]:
        return bearer(self.token)


@dataclass
class Clients:
    """Channels to the services' front proxies, the admin's token maker and what clients were told."""

    wallet: wallet_pb2_grpc.WalletAsyncStub
    table: table_pb2_grpc.TableAsyncStub
    admin: Callable[[], tuple[tuple[str, str]]]
    errors: Counter[str] = field(default_factory=Counter)
    deposited_minor: int = 0

    def refused(self, where: str, error: grpc.aio.AioRpcError) -> None:
        self.errors[f"{where}:{error.code().name}"] += 1


async def retry(call: Callable[[], Awaitable[T]], *, what: str, c: Clients, budget_s: float = 300.0) -> T:
    """``call`` until it succeeds; retryable failures (a service or link down) are waited out."""
    deadline = time.monotonic() + budget_s
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as error:
            c.refused(what, error)
            if error.code() not in RETRYABLE or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)


async def log_in(c: Clients, p: Player) -> None:
    reply = await retry(
        lambda: c.wallet.Login(wallet_pb2.LoginRequest(username=p.name, password=p.password), timeout=CALL_TIMEOUT_S),
        what="login",
        c=c,
    )
    p.token, p.account = reply.token, reply.account


async def new_player(c: Clients, name: str) -> Player:
    """Registered (idempotently), logged in and funded once with ``DEPOSIT_MINOR``."""
    p = Player(name, f"{name}-secret-pw")

    async def register() -> None:
        try:
            await c.wallet.Register(
                wallet_pb2.RegisterRequest(
                    request_id=f"reg-{name}", username=name, email=f"{name}@example.org", password=p.password
                ),
                timeout=CALL_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise

    await retry(register, what="register", c=c)
    await log_in(c, p)
    await retry(
        lambda: c.wallet.Deposit(
            wallet_pb2.DepositRequest(request_id=f"dep-{name}", account=p.account, amount_minor=DEPOSIT_MINOR),
            metadata=c.admin(),
            timeout=CALL_TIMEOUT_S,
        ),
        what="deposit",
        c=c,
    )
    c.deposited_minor += DEPOSIT_MINOR
    return p


@dataclass
class Arrival:
    at: float
    update: table_pb2.TableUpdate


class TableBots:
    """The bots of one table: watch it, play it, remember what was seen and when."""

    def __init__(self, c: Clients, table_id: str, variant: str, players: list[Player], rng: random.Random) -> None:
        self.c, self.table_id, self.variant, self.players, self.rng = c, table_id, variant, players, rng
        self.arrivals: list[Arrival] = []
        self.opened: dict[str, float] = {}  # round id -> when its opening was seen
        self.ended: dict[str, tuple[float, str]] = {}  # round id -> (when its result was seen, status)
        self.position = 0
        self.betting = True
        self._tasks: set[asyncio.Task[None]] = set()
        self._watch: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[table_pb2.TableUpdate], None]] = []

    async def create(self) -> None:
        request = table_pb2.CreateTableRequest(
            table_id=self.table_id, variant=self.variant, limits=LIMITS, config=CONFIG.get(self.variant, {})
        )

        async def create() -> None:
            try:
                await self.c.table.CreateTable(request, metadata=self.c.admin(), timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.ALREADY_EXISTS:
                    raise

        await retry(create, what="create", c=self.c)

    def start(self) -> None:
        self._watch = asyncio.create_task(self._run())

    async def stop(self) -> None:
        tasks = [t for t in (self._watch, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def listen(self, listener: Callable[[table_pb2.TableUpdate], None]) -> None:
        self._listeners.append(listener)

    def unlisten(self, listener: Callable[[table_pb2.TableUpdate], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def results_since(self, t: float) -> int:
        return sum(1 for at, _ in self.ended.values() if at > t)

    def result_times(self) -> list[float]:
        return sorted(at for at, _ in self.ended.values())

    async def _run(self) -> None:
        watcher = self.players[0]
        while True:
            try:
                request = table_pb2.WatchTableRequest(table_id=self.table_id, after_position=self.position)
                async for update in self.c.table.WatchTable(request, metadata=watcher.auth):
                    self._seen(update)
            except grpc.aio.AioRpcError as error:
                self.c.refused("watch", error)
                if error.code() == grpc.StatusCode.UNAUTHENTICATED:  # the clock moved past the token's life
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await log_in(self.c, watcher)
            await asyncio.sleep(0.3)

    def _seen(self, update: table_pb2.TableUpdate) -> None:
        now = time.monotonic()
        self.arrivals.append(Arrival(now, update))
        self.position = max(self.position, update.position)
        k = kind(update)
        if k == "round_opened" and update.round_id not in self.opened:
            self.opened[update.round_id] = now
            if self.betting:
                self._spawn(self._on_opened(update.round_id))
        elif k == "dealer_chosen" and self.betting:
            self._spawn(self._bet_against(update.round_id, update.dealer_chosen.dealer))
        elif k == "result" and update.round_id not in self.ended:
            self.ended[update.round_id] = (now, update.result.status)
        for listener in list(self._listeners):
            listener(update)

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        async def run() -> None:
            await coroutine

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, what: str, p: Player, call: Callable[[], Awaitable[object]]) -> None:
        """One bot action: refusals are counted; an expired token is renewed for the next action."""
        try:
            await call()
        except grpc.aio.AioRpcError as error:
            self.c.refused(what, error)
            if error.code() == grpc.StatusCode.UNAUTHENTICATED:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await log_in(self.c, p)

    def _bet(self, p: Player, round_id: str, n: int, area: str, amount: int) -> Callable[[], Awaitable[object]]:
        request = table_pb2.PlaceBetRequest(
            command_id=f"{round_id}.{p.name}.{n}",
            table_id=self.table_id,
            area=area,
            amount_minor=amount,
            round_id=round_id,
        )
        return lambda: self.c.table.PlaceBet(request, metadata=p.auth, timeout=CALL_TIMEOUT_S)

    async def _on_opened(self, round_id: str) -> None:
        r = self.rng
        if self.variant == "red_envelope_bull":
            dealer = r.choice(self.players)
            request = table_pb2.PlaceBidRequest(
                command_id=f"{round_id}.{dealer.name}.bid",
                table_id=self.table_id,
                amount_minor=r.choice([10_000, 20_000, 30_000]),
                round_id=round_id,
            )
            await self._call(
                "bid", dealer, lambda: self.c.table.PlaceBid(request, metadata=dealer.auth, timeout=CALL_TIMEOUT_S)
            )
            return
        bettors = self.players
        if self.variant == "baibian_bull":
            banker, bettors = self.players[0], self.players[1:]
            apply = table_pb2.ApplyBankerRequest(table_id=self.table_id, capital_minor=0)
            await self._call(
                "banker", banker, lambda: self.c.table.ApplyBanker(apply, metadata=banker.auth, timeout=CALL_TIMEOUT_S)
            )
        calls: list[tuple[str, Player, Callable[[], Awaitable[object]]]] = []
        for p in bettors:
            if self.variant == "golden_bull":
                areas = r.sample(gb.AREAS, r.randint(1, 2))
                calls += [
                    ("bet", p, self._bet(p, round_id, n, a, r.choice([100, 500, 1_000]))) for n, a in enumerate(areas)
                ]
            elif self.variant == "baibian_bull":
                calls.append(("bet", p, self._bet(p, round_id, 0, r.choice(bb.AREAS), r.choice([100, 500, 1_000]))))
            else:  # bai_buu
                areas = r.sample(bu.MAIN_AREAS, r.randint(1, 2))
                calls += [("bet", p, self._bet(p, round_id, n, a, 100 * r.randint(1, 10))) for n, a in enumerate(areas)]
                if r.random() < 0.3:
                    calls.append(("bet", p, self._bet(p, round_id, 9, r.choice(bu.JACKPOT_AREAS), 100)))
        for what, p, call in calls:
            await self._call(what, p, call)

    async def _bet_against(self, round_id: str, dealer: str) -> None:
        for p in self.players:
            if p.account != dealer:
                call = self._bet(p, round_id, 0, "dealer", self.rng.choice([100, 500, 1_000]))
                await self._call("bet", p, call)
