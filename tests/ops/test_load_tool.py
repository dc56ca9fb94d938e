"""``niuniu-load``'s own measurements that need no stack (pure: an in-process gRPC server)."""

from __future__ import annotations

import asyncio
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
