"""``python -m services.table.bench_settlement``: from the banker's reveal to the last settlement movement.

Starts rng, wallet and table as processes (a topic prefix and database schemas of
their own, against the Kafka, PostgreSQL and Redis of ``source .run/env``), seats a
banker at a 百變牛牛 table and has N bettors (200 and 1 000 by default) bet one
chip each, then reads from the services' own event stores:

- ``reveal``: when the banker's hand was opened (the round's last HandRevealed),
- ``settled``: when the table appended RoundSettled (same transaction as the bets'
  outcomes; committed right after),
- ``applied``: when the wallet appended ``wallet.round_settlement_applied``, in the
  transaction that saves every movement of the settlement and resolves every hold
  (the bettors' and the banker's): the last settlement movement.

Prints, per size and round, settled - reveal and applied - reveal in milliseconds.
A benchmark prints figures; it is never part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncGenerator, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import grpc
import psycopg
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2, table_pb2_grpc
from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc
from psycopg import sql

from backbone.auth import Role, Tokens, bearer, development_env
from backbone.eventreads import read_correlated_many
from backbone.healthcheck import check
from backbone.kafka import default_principal_env
from backbone.localports import free_port

SERVICES = ("rng", "wallet", "table")
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
HEALTH_TIMEOUT_S = 60.0
WAIT_S = 300.0
IN_FLIGHT = 25
AREAS = ("heaven", "earth", "mystic", "yellow")
Metadata = tuple[tuple[str, str]]


@contextlib.contextmanager
def services(run_id: str) -> Iterator[dict[str, str]]:
    """rng, wallet and table as processes; yields their addresses. Logs in .run/bench/<run id>/."""
    ports = {s: free_port() for s in SERVICES}
    addrs = {s: f"127.0.0.1:{ports[s]}" for s in SERVICES}
    log_dir = ROOT / ".run" / "bench" / run_id
    log_dir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for service in SERVICES:
            env = development_env(os.environ)  # the bench signs its players' tokens with the development keys
            env = default_principal_env(env)  # a prefixed system: the services' own Kafka ACLs do not cover it
            env.update(
                {
                    "NIUNIU_WALLET_THROTTLE": "address_attempts=100000/60,address_failures=100000/60",
                    "NIUNIU_TOPIC_PREFIX": f"bench{run_id}.",
                    "NIUNIU_DB_SCHEMA": schema_of(run_id, service),
                    f"NIUNIU_{service.upper()}_DSN": os.environ["DATABASE_URL"],  # one database, a schema each
                    f"NIUNIU_{service.upper()}_GRPC_PORT": str(ports[service]),
                    f"NIUNIU_{service.upper()}_METRICS_PORT": str(free_port()),
                    "NIUNIU_RNG_ADDR": addrs["rng"],
                    "NIUNIU_WALLET_ADDR": addrs["wallet"],
                }
            )
            log = (log_dir / f"{service}.log").open("ab")
            # A release's niuniu-migrate first: the services run no DDL.
            subprocess.run([str(BIN / "niuniu-migrate"), service], env=env, check=True, stdout=log, cwd=ROOT)
            cmd = [str(BIN / f"niuniu-{service}")]
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
            deadline = time.monotonic() + HEALTH_TIMEOUT_S
            while check(addrs[service]) != "SERVING":
                if procs[-1].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{service} did not start; see {log_dir / service}.log")
                time.sleep(0.2)
        yield addrs
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            for service in SERVICES:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema_of(run_id, service)}" CASCADE')


def schema_of(run_id: str, service: str) -> str:
    return f"bench_{run_id}_{service}"


class Bench:
    def __init__(self, run_id: str, addrs: dict[str, str], wallet: grpc.aio.Channel, table: grpc.aio.Channel) -> None:
        self.run_id = run_id
        self.tokens = Tokens.development()
        self.admin: Metadata = bearer(self.tokens.issue("bench-admin", Role.ADMIN))
        self.wallet = wallet_pb2_grpc.WalletStub(wallet)
        self.table = table_pb2_grpc.TableStub(table)
        self.dsn = os.environ["DATABASE_URL"]

    async def player(self, name: str, deposit_minor: int) -> tuple[str, Metadata]:
        reply = await self.wallet.Register(
            wallet_pb2.RegisterRequest(
                request_id=f"reg-{name}", username=name, email=f"{name}@example.org", password=f"{name}-bench-pw"
            )
        )
        await self.wallet.Deposit(
            wallet_pb2.DepositRequest(request_id=f"dep-{name}", account=reply.account, amount_minor=deposit_minor),
            metadata=self.admin,
        )
        return reply.account, bearer(self.tokens.issue(reply.account_id, Role.PLAYER))

    async def players(self, prefix: str, count: int) -> list[tuple[str, Metadata]]:
        gate = asyncio.Semaphore(10)

        async def one(i: int) -> tuple[str, Metadata]:
            async with gate:
                return await self.player(f"{prefix}{i}", 1_000_000)

        return list(await asyncio.gather(*(one(i) for i in range(count))))

    async def banked_rounds(self, table_id: str, watcher: Metadata) -> AsyncGenerator[str, None]:
        request = table_pb2.WatchTableRequest(table_id=table_id)
        async for update in self.table.WatchTable(request, metadata=watcher):
            if update.WhichOneof("update") == "round_opened" and update.round_opened.banker:
                yield update.round_id

    async def bet_all(self, table_id: str, round_id: str, bettors: Sequence[tuple[str, Metadata]]) -> int:
        gate = asyncio.Semaphore(IN_FLIGHT)
        rng = random.Random(round_id)

        async def one(n: int, auth: Metadata) -> int:
            request = table_pb2.PlaceBetRequest(
                command_id=f"{round_id}.b{n}", table_id=table_id, area=rng.choice(AREAS), amount_minor=100
            )
            async with gate:
                try:
                    await self.table.PlaceBet(request, metadata=auth)
                    return 1
                except grpc.aio.AioRpcError:
                    return 0

        return sum(await asyncio.gather(*(one(n, auth) for n, (_, auth) in enumerate(bettors))))

    async def wait_applied(self, round_id: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                reply = await self.wallet.GetRoundSettlement(
                    wallet_pb2.GetRoundSettlementRequest(round_id=round_id), metadata=self.admin
                )
                if reply.status == "settled":
                    return
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.NOT_FOUND:
                    raise
            await asyncio.sleep(0.05)
        raise TimeoutError(f"the wallet never applied {round_id}")

    async def timings(self, round_id: str) -> tuple[float, float]:
        """(settled - reveal, applied - reveal) in ms, from the services' event stores."""
        async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
            table = await self._times(conn, schema_of(self.run_id, "table"), round_id)
            wallet = await self._times(conn, schema_of(self.run_id, "wallet"), round_id)
        reveal = max(at for kind, at in table if kind == "table.hand_revealed")
        settled = next(at for kind, at in table if kind == "table.round_settled")
        applied = next(at for kind, at in wallet if kind == "wallet.round_settlement_applied")
        return (settled - reveal).total_seconds() * 1000, (applied - reveal).total_seconds() * 1000

    @staticmethod
    async def _times(conn: psycopg.AsyncConnection, schema: str, round_id: str) -> list[tuple[str, datetime]]:
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        events = await read_correlated_many(conn, [round_id])
        return [(e.event_type, e.envelope.occurred_at.ToDatetime(tzinfo=UTC)) for e in events]

    async def run_size(self, bettors_count: int, rounds: int) -> list[tuple[int, float, float]]:
        table_id = f"bench-{bettors_count}"
        print(f"registering a banker and {bettors_count} bettors ...", flush=True)
        _, banker = await self.player(f"bk{bettors_count}x{self.run_id}", 10**12)
        bettors = await self.players(f"b{bettors_count}x{self.run_id}x", bettors_count)
        limits = ev.TableLimits(
            min_bet_minor=100,
            max_bet_minor=10**12,
            chips_minor=[100],
            betting_seconds=5 + bettors_count // 20,
            reveal_interval_ms=0,
            pause_between_rounds_ms=0,
        )
        await self.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="baibian_bull", limits=limits),
            metadata=self.admin,
        )
        await self.table.ApplyBanker(table_pb2.ApplyBankerRequest(table_id=table_id), metadata=banker)
        results = []
        opened = self.banked_rounds(table_id, banker)
        for _ in range(rounds):
            round_id = await anext(opened)
            placed = await self.bet_all(table_id, round_id, bettors)
            await self.wait_applied(round_id)
            settled_ms, applied_ms = await self.timings(round_id)
            print(f"{bettors_count:>8} {round_id:>16} {placed:>6} {settled_ms:>12.1f} {applied_ms:>12.1f}", flush=True)
            results.append((placed, settled_ms, applied_ms))
        await opened.aclose()
        await self.table.LeaveBanker(table_pb2.LeaveBankerRequest(table_id=table_id), metadata=banker)
        return results


async def run(sizes: Sequence[int], rounds: int) -> None:
    run_id = uuid.uuid4().hex[:8]
    with services(run_id) as addrs:
        async with (
            grpc.aio.insecure_channel(addrs["wallet"]) as wallet,
            grpc.aio.insecure_channel(addrs["table"]) as table,
        ):
            bench = Bench(run_id, addrs, wallet, table)
            print(f"{'bettors':>8} {'round':>16} {'bets':>6} {'settled_ms':>12} {'applied_ms':>12}")
            summary = {size: await bench.run_size(size, rounds) for size in sizes}
    print("\nfrom the banker's reveal (median over rounds):")
    for size, rows in summary.items():
        settled = statistics.median(r[1] for r in rows)
        applied = statistics.median(r[2] for r in rows)
        print(f"  {size:>5} bettors: RoundSettled committed {settled:8.1f} ms, wallet applied {applied:8.1f} ms")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.table.bench_settlement", description=__doc__)
    parser.add_argument("--bettors", type=int, nargs="+", default=[200, 1000], help="round sizes (default 200 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size (default 3)")
    args = parser.parse_args(argv)
    for key in ("KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL", "REDIS_URL"):
        if not os.environ.get(key):
            parser.error(f"{key} is unset: run `source .run/env` first")
    asyncio.run(run(args.bettors, args.rounds))


if __name__ == "__main__":
    main()
