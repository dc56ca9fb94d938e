"""A clock 13 hours ahead still plays a full round.

The four services run under libfaketime (Debian's ``faketime`` package) with their wall
clock read from a file: a round is played, then every service's clock jumps 13 h
forward, past the 12 h lifetime the table's one-off service token used to have, and a
second round is played. Its bets need the table's holds at the wallet and its commit
and draw at the rng, so they work only if the table renewed its own token.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from niuniu.ledger.v1 import ledger_pb2_grpc
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2, table_pb2_grpc
from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc
from play import Watcher, kind, settle_everything
from players import Clients, Player
from stack import ROOT, Stack

from backbone.auth import Role, Tokens, bearer
from backbone.kafka import TopicSpec, ensure_topics
from backbone.topics import Topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LIBFAKETIME = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))), Path("/nonexistent"))
AHEAD_S = 13 * 3600
FAST = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=5_000,
    chips_minor=[100],
    betting_seconds=2,
    reveal_interval_ms=10,
    pause_between_rounds_ms=100,
)


class FakedClockStack(Stack):
    """Every service's wall clock (and monotonic clock) is real time plus the offset in ``clock_file``."""

    clock_file: Path

    def env(self, service: str) -> dict[str, str]:
        env = super().env(service)
        env.update(
            {
                "LD_PRELOAD": str(LIBFAKETIME),
                "FAKETIME_TIMESTAMP_FILE": str(self.clock_file),
                "FAKETIME_CACHE_DURATION": "1",  # re-read the offset every second
            }
        )
        return env


@pytest.fixture(scope="module")
def faked(infra: dict[str, str]) -> Iterator[FakedClockStack]:
    if not LIBFAKETIME.exists():
        pytest.fail("libfaketime is not installed: scripts/infra up installs it (apt-get install faketime)")
    run_id = uuid.uuid4().hex[:8]
    system = FakedClockStack(run_id, infra, ROOT / ".run" / "security" / f"clock-{run_id}")
    system.clock_file = system.log_dir / "faketime"
    system.clock_file.write_text("+0\n")
    # The broker refuses records stamped more than an hour ahead of its own clock
    # (log.message.timestamp.after.max.ms), and only the services' clocks move here: the
    # run's topics take the broker's append time instead of the producers' clock.
    specs = [
        TopicSpec(spec.name, spec.partitions, {**spec.config, "message.timestamp.type": "LogAppendTime"})
        for spec in Topics(system.prefix).specs()
    ]
    ensure_topics(infra["KAFKA_BOOTSTRAP_SERVERS"], specs)
    try:
        system.start_all()
        yield system
    finally:
        system.stop_all()


def staff(wallet: grpc.aio.Channel, table: grpc.aio.Channel, ledger: grpc.aio.Channel, tokens: Tokens) -> Clients:
    return Clients(
        wallet_pb2_grpc.WalletStub(wallet),
        table_pb2_grpc.TableStub(table),
        ledger_pb2_grpc.LedgerStub(ledger),
        bearer(tokens.issue("clock-admin", Role.ADMIN)),
        bearer(tokens.issue("clock-auditor", Role.AUDITOR)),
    )


async def log_in(c: Clients, name: str) -> tuple[Player, int]:
    login = await c.wallet.Login(wallet_pb2.LoginRequest(username=name, password=f"{name}-secret-pw"))
    return Player(name, login.token, login.account), int(login.expires_at_unix_ms)


async def play_round(c: Clients, player: Player, table_id: str, seen: set[str]) -> table_pb2.TableUpdate:
    """One bet in a round opened from now on, up to its settled result and revealed seed."""
    watcher = Watcher(c, player, table_id)
    try:
        while True:
            opened = await watcher.wait_for(lambda u: kind(u) == "round_opened" and u.round_id not in seen)
            seen.add(opened.round_id)
            request = table_pb2.PlaceBetRequest(
                command_id=f"{opened.round_id}.bet",
                table_id=table_id,
                round_id=opened.round_id,
                area="area_1",
                amount_minor=500,
            )
            try:
                await c.table.PlaceBet(request, metadata=player.auth)
                break
            except grpc.aio.AioRpcError as error:  # the window closed under us: the next round
                assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
        result = await watcher.wait_for(lambda u: kind(u) == "result" and u.round_id == opened.round_id)
        await watcher.wait_for(lambda u: kind(u) == "seed_revealed" and u.round_id == opened.round_id)
        return result
    finally:
        await watcher.stop()


async def test_a_clock_13_hours_ahead_still_plays_a_full_round(faked: FakedClockStack) -> None:
    offset_s = [0.0]
    tokens = Tokens.development(clock=lambda: time.time() + offset_s[0])  # the operator's tools share the clock
    name = f"clock{faked.run_id}"
    table_id = "clock-table"
    seen: set[str] = set()
    async with (
        grpc.aio.insecure_channel(faked.addr("wallet")) as w,
        grpc.aio.insecure_channel(faked.addr("table")) as t,
        grpc.aio.insecure_channel(faked.addr("ledger")) as lg,
    ):
        c = staff(w, t, lg, tokens)
        await c.wallet.Register(
            wallet_pb2.RegisterRequest(
                request_id=f"reg-{name}", username=name, email=f"{name}@example.org", password=f"{name}-secret-pw"
            )
        )
        player, _ = await log_in(c, name)
        await c.wallet.Deposit(
            wallet_pb2.DepositRequest(request_id=f"dep-{name}", account=player.account, amount_minor=100_000),
            metadata=c.admin,
        )
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=FAST), metadata=c.admin
        )
        first = await play_round(c, player, table_id, seen)
        assert first.result.status == "settled" and len(first.result.my_bets) == 1

        faked.clock_file.write_text(f"+{AHEAD_S}\n")
        offset_s[0] = AHEAD_S
        await asyncio.sleep(3)  # every process has re-read the offset
        c = staff(w, t, lg, tokens)
        player, expires_ms = await log_in(c, name)
        # The wallet's clock did move: its log-in token expires 12 h after a moment 13 h from now.
        assert expires_ms > (time.time() + AHEAD_S + 11 * 3600) * 1000
        second = await play_round(c, player, table_id, seen)
        assert second.result.status == "settled" and len(second.result.my_bets) == 1
        await settle_everything(c, [player])
        balance = await c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(), metadata=player.auth)
        assert balance.held_minor == 0
