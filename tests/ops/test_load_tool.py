"""``niuniu-load``'s own measurements that need no stack (pure: an in-process gRPC server)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tools import load


class CountingHealth(health.aio.HealthServicer):
    """The health servicer, counting the calls it answers and how many were outstanding at once."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = 0
        self.outstanding = 0
        self.most_outstanding = 0

    async def Check(self, request: Any, context: Any) -> health_pb2.HealthCheckResponse:
        self.outstanding += 1
        self.most_outstanding = max(self.most_outstanding, self.outstanding)
        try:
            await asyncio.sleep(0.01)  # long enough for the calls in flight to overlap
            self.answered += 1
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        finally:
            self.outstanding -= 1


async def test_the_empty_call_rate_keeps_that_many_calls_in_flight_and_counts_what_was_answered() -> None:
    server = grpc.aio.server()
    servicer = CountingHealth()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            rate = await load.empty_call_rate(channel, in_flight=8, seconds=0.5)
    finally:
        await server.stop(None)
    assert servicer.most_outstanding == 8
    # Every call counted was answered; each takes >= 10 ms, so 8 in flight answer at most ~800/s.
    assert 0 < rate <= 8 / 0.01
    assert abs(rate * 0.5 - servicer.answered) <= 0.1 * servicer.answered + 8


BURN_S = 0.3
NAMED_POSTGRES = r"""
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(15, b"postgres", 0, 0, 0)  # PR_SET_NAME: this process reads as "postgres"
child = os.fork()
if child == 0:
    ctypes.CDLL(None).prctl(15, b"postgres", 0, 0, 0)
    started = time.process_time()
    while time.process_time() - started < float(sys.argv[1]):
        pass
    os._exit(0)
os.waitpid(child, 0)  # reaped: its CPU moves to this process's children's times
print("reaped", flush=True)
sys.stdin.read()  # alive (a "postmaster") until the test is done with it
"""


def test_the_cpu_of_postgres_backends_that_ended_during_a_run_is_counted() -> None:
    before = load.infra_cpu_seconds().get("postgres", 0.0)
    with subprocess.Popen(
        [sys.executable, "-c", NAMED_POSTGRES, str(BURN_S)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as postmaster:
        assert postmaster.stdout is not None and postmaster.stdout.readline().strip() == "reaped"
        after = load.infra_cpu_seconds().get("postgres", 0.0)
        postmaster.communicate("")
    # The backend has exited; its CPU is found through the process that reaped it.
    assert after - before >= 0.8 * BURN_S


def test_cpu_lines_give_cores_and_milliseconds_per_accepted_bet() -> None:
    lines = load.cpu_lines({"table": 5.0, "postgres": 2.5}, machine_s=15.0, seconds=10.0, accepted=2_000)
    cores = os.cpu_count()
    assert lines == [
        f"  CPU (cores): table 0.50, postgres 0.25; machine 1.50 of {cores} busy",
        "  CPU ms per accepted bet: table 2.50, postgres 1.25; machine 7.50",
    ]
    assert load.cpu_lines({"table": 1.0}, machine_s=float("nan"), seconds=2.0, accepted=0) == [
        "  CPU (cores): table 0.50"
    ]
