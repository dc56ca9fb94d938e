"""Exposure: where a service listens, and what reflection tells (in-process servers, no infrastructure)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2
from niuniu.rng.v1 import rng_pb2

from backbone.config import Settings
from backbone.grpcserver import start_server

RNG = rng_pb2.DESCRIPTOR.services_by_name["Rng"].full_name
TEST_ONLY = [f"{RNG}.SetTestDeck", f"{RNG}.SetTestEnvelope"]


def settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for key in ("NIUNIU_BIND_HOST", "NIUNIU_WALLET_BIND_HOST"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return Settings.from_env("wallet", grpc_port=50053, metrics_port=9103)


def test_services_bind_loopback_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings(monkeypatch).bind_host == "127.0.0.1"
    assert settings(monkeypatch, NIUNIU_BIND_HOST="0.0.0.0").bind_host == "0.0.0.0"
    assert settings(monkeypatch, NIUNIU_BIND_HOST="0.0.0.0", NIUNIU_WALLET_BIND_HOST="10.0.0.5").bind_host == "10.0.0.5"


def register_rng(server: grpc.aio.Server) -> Sequence[str]:
    """The Rng service's name with one trivial method: reflection describes it from the descriptors."""

    async def commit(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return b""

    handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {"Commit": grpc.unary_unary_rpc_method_handler(commit)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(RNG, handlers),))
    return [RNG]


async def reflected_methods(port: int) -> set[str] | grpc.StatusCode:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        # What reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo is, typed
        # (its stubs leave the method untyped and accept only a synchronous channel).
        info: grpc.aio.StreamStreamMultiCallable[
            reflection_pb2.ServerReflectionRequest, reflection_pb2.ServerReflectionResponse
        ] = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=RNG)
        try:
            async for reply in info(iter([request])):
                methods = set()
                for raw in reply.file_descriptor_response.file_descriptor_proto:
                    proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
                    methods |= {f"{proto.package}.{s.name}.{m.name}" for s in proto.service for m in s.method}
                return methods
        except grpc.aio.AioRpcError as error:
            return error.code()
    raise AssertionError("no reflection reply")


async def test_reflection_hides_the_test_only_methods_and_can_be_switched_off() -> None:
    for hidden, enabled in (((), True), (TEST_ONLY, True), ((), False)):
        running = await start_server(register_rng, reflection_enabled=enabled, hidden_methods=hidden)
        try:
            methods = await reflected_methods(running.port)
        finally:
            await running.stop(0.1)
        if not enabled:
            assert methods == grpc.StatusCode.UNIMPLEMENTED
        elif hidden:
            assert isinstance(methods, set) and f"{RNG}.Draw" in methods and not methods & set(TEST_ONLY)
        else:
            assert isinstance(methods, set) and set(TEST_ONLY) <= methods  # the descriptors do have them
