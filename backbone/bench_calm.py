"""What one step of a bet costs in CPU when it goes alone, against the same step in a crowd.

``python -m backbone.bench_calm [--seconds S] [--runs R] [--rate N]`` measures the two steps a bet's path
is made of, each on its own, at a calm offered rate (``--rate`` a second, each started on time whether or
not the one before ended: open loop) and in a crowd (64 calls in flight, 8 transactions side by side):

- **call**: an empty unary gRPC call (the health service's ``Check``) from this process to a server in a
  child process, both on uvloop as the services run, on loopback without TLS (as ``niuniu-load`` runs the
  services); CPU of the caller and of the server process.
- **transaction**: a transaction of four one-row reads sent together (``backbone.db.sent_together``, as
  the table's bet check), on ``DATABASE_URL``; CPU of this process and of the PostgreSQL backend serving
  it (read from ``/proc``; "n/a" when the server is not a process of this machine).

Each figure is milliseconds of CPU per operation, min/median/max of the runs, then pgbench's commits on
the same server right after (``backbone.limits``). The last line adds the figures up as a bet's path
takes them (two calls: the client's to the table and the table's to the wallet; three transactions: the
table's check, the wallet's hold, the table's recording), calm and in a crowd: a floor before any of the
bet's own work, its events' relays and consumers, or the load generator.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psycopg
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from backbone.db import sent_together
from backbone.limits import pgbench_commits
from backbone.localports import free_port

CALLS_IN_CROWD = 64
TRANSACTIONS_IN_CROWD = 8
WARM_UP = 200
PATH_CALLS = 2
PATH_TRANSACTIONS = 3
SERVER_START_TIMEOUT_S = 30.0


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid`` so far, or None if it cannot be read here."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Cost:
    """CPU milliseconds per operation on each side, and the operations a second achieved."""

    rate: float
    here_ms: float
    there_ms: float | None


async def _paced(op: Callable[[int], Coroutine[Any, Any, None]], rate: float, seconds: float) -> int:
    """``op`` started ``rate`` times a second for ``seconds`` (open loop); the number run."""
    started, tasks = time.monotonic(), set[asyncio.Task[None]]()
    n = 0
    while (due := started + n / rate) < started + seconds:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        task = asyncio.create_task(op(0))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1
    await asyncio.gather(*tasks)
    return n


async def _crowd(op: Callable[[int], Awaitable[None]], width: int, seconds: float) -> int:
    """``width`` loops each running ``op`` back to back for ``seconds``; the number run."""
    end, done = time.monotonic() + seconds, [0] * width

    async def loop(i: int) -> None:
        while time.monotonic() < end:
            await op(i)
            done[i] += 1

    await asyncio.gather(*(loop(i) for i in range(width)))
    return sum(done)


async def _measure(run: Callable[[], Awaitable[int]], there: list[int]) -> Cost:
    before_here, before_there = time.process_time(), [process_cpu_s(p) for p in there]
    started = time.monotonic()
    n = await run()
    elapsed, here = time.monotonic() - started, time.process_time() - before_here
    after_there = [process_cpu_s(p) for p in there]
    spent = [b - a for a, b in zip(before_there, after_there, strict=True) if a is not None and b is not None]
    there_ms = 1000 * sum(spent) / n if there and len(spent) == len(there) else None
    return Cost(n / elapsed, 1000 * here / n, there_ms)


@contextlib.contextmanager
def _server() -> Iterator[tuple[int, int]]:
    """A gRPC health server in a child process: (its pid, its port)."""
    port = free_port()
    child = subprocess.Popen([sys.executable, "-m", "backbone.bench_calm", "--serve", str(port)])
    try:
        yield child.pid, port
    finally:
        child.terminate()
        child.wait(10)


async def _serve(port: int) -> None:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def calls(rate: float, seconds: float, runs: int) -> tuple[list[Cost], list[Cost]]:
    """The empty call's cost, calm and in a crowd, ``runs`` times each (alternated)."""
    with _server() as (pid, port):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), SERVER_START_TIMEOUT_S)
            stub, request = health_pb2_grpc.HealthStub(channel), health_pb2.HealthCheckRequest()

            async def call(_: int) -> None:
                await stub.Check(request, timeout=30)  # type: ignore[attr-defined]

            for _ in range(WARM_UP):
                await call(0)
            calm, crowd = [], []
            for _ in range(runs):
                calm.append(await _measure(lambda: _paced(call, rate, seconds), [pid]))
                crowd.append(await _measure(lambda: _crowd(call, CALLS_IN_CROWD, seconds), [pid]))
    return calm, crowd


async def transactions(dsn: str, rate: float, seconds: float, runs: int) -> tuple[list[Cost], list[Cost]]:
    """The four-read transaction's cost, calm (one connection) and in a crowd, ``runs`` times each."""
    conns = [await psycopg.AsyncConnection.connect(dsn) for _ in range(TRANSACTIONS_IN_CROWD)]
    try:

        async def transaction(i: int) -> None:
            conn = conns[i]
            async with sent_together(conn):
                cursors = [conn.cursor() for _ in range(4)]
                for n, cursor in enumerate(cursors):
                    await cursor.execute("SELECT %s::int + 1", (n,))
            for cursor in cursors:
                await cursor.fetchall()

        free: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(conns)):
            free.put_nowait(i)

        async def on_a_free_connection(_: int) -> None:
            """Calm: a transaction still running when the next is due leaves it another connection."""
            i = await free.get()
            try:
                await transaction(i)
            finally:
                free.put_nowait(i)

        for _ in range(WARM_UP):
            await transaction(0)
        backends = [conn.info.backend_pid for conn in conns]
        calm, crowd = [], []
        for _ in range(runs):
            calm.append(await _measure(lambda: _paced(on_a_free_connection, rate, seconds), backends))
            crowd.append(await _measure(lambda: _crowd(transaction, TRANSACTIONS_IN_CROWD, seconds), backends))
    finally:
        for conn in conns:
            await conn.close()
    return calm, crowd


def _mmm(values: list[float], form: str = "{:.3f}") -> str:
    return " / ".join(form.format(v) for v in (min(values), statistics.median(values), max(values)))


def _line(name: str, costs: list[Cost], there: str) -> str:
    theres = [c.there_ms for c in costs if c.there_ms is not None]
    far = _mmm(theres) if len(theres) == len(costs) else "n/a"
    rate = _mmm([c.rate for c in costs], "{:.0f}")
    return f"  {name:22} {rate:>20}/s   here {_mmm([c.here_ms for c in costs])}   {there} {far}"


def _median_total(costs: list[Cost]) -> float:
    return statistics.median(c.here_ms + (c.there_ms or 0.0) for c in costs)


async def run(dsn: str, rate: float, seconds: float, runs: int) -> list[str]:
    call_calm, call_crowd = await calls(rate, seconds, runs)
    tx_calm, tx_crowd = await transactions(dsn, rate, seconds, runs)
    lines = [
        f"CPU ms per operation, min / median / max of {runs} runs of {seconds:g} s"
        f" (calm: {rate:g} a second, open loop; crowd: {CALLS_IN_CROWD} calls, {TRANSACTIONS_IN_CROWD}"
        " transactions side by side)",
        _line("call, calm", call_calm, "server"),
        _line("call, crowd", call_crowd, "server"),
        _line("transaction, calm", tx_calm, "backend"),
        _line("transaction, crowd", tx_crowd, "backend"),
    ]
    calm = PATH_CALLS * _median_total(call_calm) + PATH_TRANSACTIONS * _median_total(tx_calm)
    crowd = PATH_CALLS * _median_total(call_crowd) + PATH_TRANSACTIONS * _median_total(tx_crowd)
    lines.append(f"PostgreSQL underneath, right after: {await pgbench_commits(dsn)}")
    lines.append(
        f"a bet's path ({PATH_CALLS} calls, {PATH_TRANSACTIONS} transactions), medians, both sides:"
        f" calm {calm:.2f} ms, crowd {crowd:.2f} ms ({calm / crowd:.2f}x)"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="each run's length (default 10)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind (default 3)")
    parser.add_argument("--rate", type=float, default=100.0, help="calm operations a second (default 100)")
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        uvloop.run(_serve(args.serve))
        return 0
    if not (0.5 <= args.seconds <= 600 and 1 <= args.runs <= 20 and 1 <= args.rate <= 2_000):
        parser.error("--seconds 0.5..600, --runs 1..20, --rate 1..2000")
    dsn = os.environ.get("DATABASE_URL", "postgresql://niuniu@127.0.0.1:54329/niuniu_test")
    for line in uvloop.run(run(dsn, args.rate, args.seconds, args.runs)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
