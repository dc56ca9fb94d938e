"""Calls spread over every address a name resolves to, and servers make clients reconnect.

Real gRPC servers on loopback, started with the project's options; the channels are the
project's (``tls.aio_channel``). A target of two addresses (``ipv4:A,B``) stands in for a
headless Service's name, which resolves to every pod.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import grpc
import pytest

from backbone.config import ConfigError, GrpcSettings
from backbone.grpcserver import RunningServer, start_server
from backbone.tls import aio_channel

CALLS = 20


class Counting:
    """A server's calls by the client connection (peer address and port) they came on."""

    def __init__(self) -> None:
        self.peers: Counter[str] = Counter()

    async def handle(self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        self.peers[context.peer()] += 1
        return request

    def register(self, server: grpc.aio.Server) -> Sequence[str]:
        handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(self.handle)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Echo": handler}),))
        return ["test.Echo"]


@asynccontextmanager
async def servers(count: int) -> AsyncIterator[list[tuple[RunningServer, Counting]]]:
    async with AsyncExitStack() as stack:
        started = []
        for _ in range(count):
            counting = Counting()
            running = await start_server(counting.register, reflection_enabled=False)
            stack.push_async_callback(running.stop, 0)
            started.append((running, counting))
        yield started


async def call(channel: grpc.aio.Channel, times: int, pause_s: float = 0.0) -> None:
    echo: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/test.Echo/Echo")
    for _ in range(times):
        assert await echo(b"x", timeout=5, wait_for_ready=True) == b"x"
        await asyncio.sleep(pause_s)


def two_addresses(started: Sequence[tuple[RunningServer, Any]]) -> str:
    return "ipv4:" + ",".join(f"127.0.0.1:{running.port}" for running, _ in started)


async def test_a_channel_spreads_its_calls_over_every_address() -> None:
    async with servers(2) as started:
        async with aio_channel(two_addresses(started), None, env={}) as channel:
            await call(channel, CALLS)
        served = [sum(counting.peers.values()) for _, counting in started]
        # In turn, once both connections are up (the first calls may go to the first one ready).
        assert sum(served) == CALLS and min(served) >= CALLS // 3, served


async def test_pick_first_stays_on_one_address_when_configured() -> None:
    async with servers(2) as started:
        async with aio_channel(two_addresses(started), None, env={"NIUNIU_GRPC_LB_POLICY": "pick_first"}) as channel:
            await call(channel, CALLS)
        served = sorted(sum(counting.peers.values()) for _, counting in started)
        assert served == [0, CALLS]


async def test_a_server_past_its_connection_age_makes_the_client_reconnect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIUNIU_GRPC_MAX_CONNECTION_AGE_MS", "300")
    monkeypatch.setenv("NIUNIU_GRPC_MAX_CONNECTION_AGE_GRACE_MS", "1000")
    async with servers(1) as [(running, counting)]:
        async with aio_channel(f"127.0.0.1:{running.port}", None, env={}) as channel:
            await call(channel, CALLS, pause_s=0.1)  # two seconds: several connection ages
        assert sum(counting.peers.values()) == CALLS
        assert len(counting.peers) >= 3, f"calls came on {len(counting.peers)} connection(s)"


async def test_without_a_short_age_one_connection_serves_every_call() -> None:
    async with servers(1) as [(running, counting)]:
        async with aio_channel(f"127.0.0.1:{running.port}", None, env={}) as channel:
            await call(channel, CALLS, pause_s=0.1)
        assert len(counting.peers) == 1


def test_the_settings_refuse_an_unknown_policy_and_a_bad_age() -> None:
    assert GrpcSettings.from_env({}) == GrpcSettings("round_robin", 60_000, 600_000)
    with pytest.raises(ConfigError, match="NIUNIU_GRPC_LB_POLICY"):
        GrpcSettings.from_env({"NIUNIU_GRPC_LB_POLICY": "random"})
    with pytest.raises(ConfigError, match="NIUNIU_GRPC_MAX_CONNECTION_AGE_MS"):
        GrpcSettings.from_env({"NIUNIU_GRPC_MAX_CONNECTION_AGE_MS": "0"})
