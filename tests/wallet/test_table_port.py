"""The table's wallet port (``services.table.ports.GrpcWallet``): holds asked at the same moment go to
the wallet in one PlaceHolds call, and each bet still gets its own answer; a round's holds are read
back in GetHolds calls, not hold by hold."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
from niuniu.wallet.v1 import wallet_pb2 as pb
from prometheus_client import REGISTRY
from wallet_helpers import TABLE, TOKENS, Wallet, wallet_service

from backbone.errors import FailedPrecondition, InvalidArgument, Unavailable
from services.table.ports import HOLD_IDS_PER_READ, GrpcWallet, WalletHold


def started(method: str) -> float:
    labels = {"grpc_service": "niuniu.wallet.v1.Wallet", "grpc_method": method, "grpc_type": "unary"}
    return REGISTRY.get_sample_value("grpc_server_started_total", labels) or 0.0


@contextlib.asynccontextmanager
async def fake_wallet(handler: grpc.GenericRpcHandler) -> AsyncIterator[GrpcWallet]:
    """The table's port to an in-process fake wallet serving ``handler``."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port_number = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port_number}") as channel:
            yield GrpcWallet(channel, TOKENS)
    finally:
        await server.stop(0)


@pytest.fixture
async def wallet(infra: dict[str, str], unique: str) -> AsyncIterator[Wallet]:
    async with wallet_service(infra, unique) as w:
        yield w


@pytest.mark.integration
async def test_holds_asked_together_go_in_few_calls_and_each_bet_gets_its_own_answer(wallet: Wallet) -> None:
    rich = [await wallet.player(deposit_minor=1_000) for _ in range(30)]
    poor = await wallet.player(deposit_minor=10)
    calls_before, singles_before = started("PlaceHolds"), started("PlaceHold")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{wallet.running.port}") as channel:
        port = GrpcWallet(channel, TOKENS)
        asks = [port.place_hold(f"bet.{p.account}", p.account, 400, "bet", "r1", 0) for p in rich]
        asks.append(port.place_hold("bet.poor", poor.account, 400, "bet", "r1", 0))
        asks.append(port.place_hold("bad id", rich[0].account, 400, "bet", "r1", 0))
        outcomes = await asyncio.gather(*asks, return_exceptions=True)
    assert outcomes[:30] == [None] * 30
    short, malformed = outcomes[30:]
    assert isinstance(short, FailedPrecondition) and short.reason == "INSUFFICIENT_FUNDS"
    assert isinstance(malformed, InvalidArgument) and malformed.reason == "HOLD_ID_INVALID"
    for p in rich:
        assert await wallet.balance(p.account) == (600, 400)
    assert await wallet.balance(poor.account) == (10, 0)
    calls = started("PlaceHolds") - calls_before
    assert 1 <= calls < 32 / 2  # two calls under way at once; the 32 holds in a few calls, not one each
    assert started("PlaceHold") == singles_before


@pytest.mark.integration
async def test_a_rounds_holds_are_read_in_calls_of_the_wallets_bound_not_one_by_one(wallet: Wallet) -> None:
    """``read_holds``: GetHolds in chunks of ``HOLD_IDS_PER_READ`` (no GetHold per hold); the holds found
    by id, an unknown one left out, an open and a voided one told apart."""
    player = await wallet.player(deposit_minor=1_000)
    first, last = await wallet.hold(player.account, 100, round_id="r1"), await wallet.hold(player.account, 200)
    await wallet.stub.VoidHold(pb.VoidHoldRequest(hold_id=last.hold_id), metadata=TABLE)
    unknown = [f"h-none-{i}" for i in range(HOLD_IDS_PER_READ + 200)]
    ids = [first.hold_id, *unknown[:HOLD_IDS_PER_READ], last.hold_id, *unknown[HOLD_IDS_PER_READ:], first.hold_id]
    bulk_before, singles_before = started("GetHolds"), started("GetHold")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{wallet.running.port}") as channel:
        found = await GrpcWallet(channel, TOKENS).read_holds(ids)
    assert found == {
        first.hold_id: WalletHold(first.hold_id, player.account, 100, "r1", True),
        last.hold_id: WalletHold(last.hold_id, player.account, 200, "", False),
    }
    assert started("GetHolds") - bulk_before == 2  # 1 202 distinct ids: two calls of at most 1 000
    assert started("GetHold") == singles_before


class DownWallet:
    """A wallet that answers every PlaceHolds with UNAVAILABLE, and counts them."""

    def __init__(self) -> None:
        self.calls = 0
        self.holds = 0

    async def place_holds(
        self, request: pb.PlaceHoldsRequest, context: grpc.aio.ServicerContext[pb.PlaceHoldsRequest, None]
    ) -> pb.PlaceHoldsResponse:
        self.calls += 1
        self.holds += len(request.holds)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "down for the test")
        raise AssertionError("unreachable")

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.unary_unary_rpc_method_handler(
            self.place_holds,
            request_deserializer=pb.PlaceHoldsRequest.FromString,
            response_serializer=pb.PlaceHoldsResponse.SerializeToString,
        )
        return grpc.method_handlers_generic_handler("niuniu.wallet.v1.Wallet", {"PlaceHolds": method})


async def test_a_failed_call_answers_each_of_its_holds_once_without_asking_hold_by_hold() -> None:
    down = DownWallet()
    async with fake_wallet(down.handler()) as port:
        asks = [port.place_hold(f"h.{i}", f"player:p{i}", 100, "bet", "r1", 0) for i in range(20)]
        outcomes = await asyncio.gather(*asks, return_exceptions=True)
    assert all(isinstance(o, Unavailable) and o.reason == "WALLET_UNAVAILABLE" for o in outcomes), outcomes
    assert down.holds == 20  # each hold asked once: a failed group is not asked again hold by hold
    assert down.calls < 20


class WalletBeforeGetHolds:
    """A wallet of the release before GetHolds: GetHold only (GetHolds is UNIMPLEMENTED), counting calls."""

    def __init__(self, holds: list[pb.Hold]) -> None:
        self.holds = {h.hold_id: h for h in holds}
        self.calls = 0

    async def get_hold(
        self, request: pb.GetHoldRequest, context: grpc.aio.ServicerContext[pb.GetHoldRequest, None]
    ) -> pb.Hold:
        self.calls += 1
        if request.hold_id not in self.holds:
            await context.abort(grpc.StatusCode.NOT_FOUND, "HOLD_NOT_FOUND: no such hold")
        return self.holds[request.hold_id]

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.unary_unary_rpc_method_handler(
            self.get_hold,
            request_deserializer=pb.GetHoldRequest.FromString,
            response_serializer=pb.Hold.SerializeToString,
        )
        return grpc.method_handlers_generic_handler("niuniu.wallet.v1.Wallet", {"GetHold": method})


async def test_a_wallet_without_get_holds_is_read_hold_by_hold() -> None:
    """While a rolling update or a rollback mixes releases, a wallet that answers GetHolds UNIMPLEMENTED
    is read with one GetHold per hold, an unknown hold left out, rather than settling rounds unchecked."""
    open_hold = pb.Hold(hold_id="h.1", account="player:p1", amount_minor=100, round_id="r1", status=pb.HOLD_STATUS_OPEN)
    posted = pb.Hold(hold_id="h.2", account="player:p2", amount_minor=50, round_id="r1", status=pb.HOLD_STATUS_POSTED)
    old = WalletBeforeGetHolds([open_hold, posted])
    async with fake_wallet(old.handler()) as port:
        found = await port.read_holds(["h.1", "h.2", "h.none", "h.1"])
    assert found == {
        "h.1": WalletHold("h.1", "player:p1", 100, "r1", True),
        "h.2": WalletHold("h.2", "player:p2", 50, "r1", False),
    }
    assert old.calls == 3  # each distinct id once
