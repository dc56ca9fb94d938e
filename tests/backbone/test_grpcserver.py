"""The gRPC bootstrap: error mapping, metrics, health, reflection, graceful stop (in-process, port 0)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from prometheus_client import REGISTRY

from backbone.errors import REASON_METADATA_KEY, InvalidArgument, NotFound
from backbone.grpcserver import RunningServer, start_server

SERVICE = "test.Probe"


async def ok(request: bytes, context: Any) -> bytes:
    return request.upper()


async def bad_input(request: bytes, context: Any) -> bytes:
    raise InvalidArgument("AMOUNT_NOT_POSITIVE", "amount_minor must be > 0")


async def missing(request: bytes, context: Any) -> bytes:
    raise NotFound("ACCOUNT_NOT_FOUND", "no account 42")


async def bug(request: bytes, context: Any) -> bytes:
    raise KeyError("a programming error")


async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
    yield b"one"
    raise InvalidArgument("STREAM_BAD", "second item refused")


async def forever(request: bytes, context: Any) -> AsyncIterator[bytes]:
    while True:
        yield b"tick"
        await asyncio.sleep(0.01)


def register(server: grpc.aio.Server) -> Sequence[str]:
    unary: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
        name: grpc.unary_unary_rpc_method_handler(fn)
        for name, fn in {"Ok": ok, "BadInput": bad_input, "Missing": missing, "Bug": bug}.items()
    }
    unary["Stream"] = grpc.unary_stream_rpc_method_handler(stream)
    unary["Forever"] = grpc.unary_stream_rpc_method_handler(forever)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, unary),))
    return [SERVICE]


@pytest.fixture
async def running() -> AsyncIterator[RunningServer]:
    server = await start_server(register)
    yield server
    await server.stop(0.1)


async def call(port: int, method: str, payload: bytes = b"x") -> tuple[bytes | None, grpc.aio.AioRpcError | None]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(f"/{SERVICE}/{method}")
            return await unary(payload), None
        except grpc.aio.AioRpcError as error:
            return None, error


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_domain_errors_map_to_their_status_with_a_reason(running: RunningServer) -> None:
    reply, error = await call(running.port, "BadInput")
    assert reply is None and error is not None
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "AMOUNT_NOT_POSITIVE" in (error.details() or "")
    assert (REASON_METADATA_KEY, "AMOUNT_NOT_POSITIVE") in tuple(error.trailing_metadata() or ())

    _, error = await call(running.port, "Missing")
    assert error is not None and error.code() == grpc.StatusCode.NOT_FOUND


async def test_unexpected_exception_is_internal_never_unknown(running: RunningServer) -> None:
    _, error = await call(running.port, "Bug")
    assert error is not None
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "KeyError" not in (error.details() or "")  # internals are logged, not sent


async def test_streaming_errors_are_mapped_too(running: RunningServer) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        streaming: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(f"/{SERVICE}/Stream")
        call_ = streaming(b"x")
        got = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for item in call_:
                got.append(item)
        assert got == [b"one"]
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_red_metrics_count_started_handled_and_time(running: RunningServer) -> None:
    labels = {"grpc_service": SERVICE, "grpc_method": "BadInput", "grpc_type": "unary"}
    before_started = counter("grpc_server_started_total", **labels)
    before_handled = counter("grpc_server_handled_total", **labels, grpc_code="INVALID_ARGUMENT")
    before_ok = counter(
        "grpc_server_handled_total", grpc_service=SERVICE, grpc_method="Ok", grpc_type="unary", grpc_code="OK"
    )
    await call(running.port, "BadInput")
    reply, _ = await call(running.port, "Ok", b"hi")
    assert reply == b"HI"
    assert counter("grpc_server_started_total", **labels) == before_started + 1
    assert counter("grpc_server_handled_total", **labels, grpc_code="INVALID_ARGUMENT") == before_handled + 1
    assert (
        counter("grpc_server_handled_total", grpc_service=SERVICE, grpc_method="Ok", grpc_type="unary", grpc_code="OK")
        == before_ok + 1
    )
    assert counter("grpc_server_handling_seconds_count", **labels) >= 1


async def test_health_serving_then_not_serving_on_graceful_stop() -> None:
    server = await start_server(register)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        # What health_pb2_grpc.HealthStub(channel).Check is, typed (its stubs declare no methods).
        check: grpc.aio.UnaryUnaryMultiCallable[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse] = (
            channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )
        )
        reply = await check(health_pb2.HealthCheckRequest(service=SERVICE))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        await server.health.enter_graceful_shutdown()
        reply = await check(health_pb2.HealthCheckRequest(service=SERVICE))
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    await server.stop(0.1)


async def test_reflection_lists_the_services(running: RunningServer) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        # What reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo is, typed
        # (its stubs leave the method untyped and accept only a synchronous channel).
        info: grpc.aio.StreamStreamMultiCallable[
            reflection_pb2.ServerReflectionRequest, reflection_pb2.ServerReflectionResponse
        ] = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )

        async def requests() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        names: set[str] = set()
        async for response in info(requests()):
            names |= {s.name for s in response.list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health"} <= names


async def test_a_client_leaving_a_stream_is_cancelled_not_a_server_error(running: RunningServer) -> None:
    labels = {"grpc_service": SERVICE, "grpc_method": "Forever", "grpc_type": "server_stream"}
    before = counter("grpc_server_handled_total", **labels, grpc_code="CANCELLED")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        forever_: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(f"/{SERVICE}/Forever")
        call = forever_(b"x")
        async for _ in call:
            break
        call.cancel()
    for _ in range(100):
        if counter("grpc_server_handled_total", **labels, grpc_code="CANCELLED") > before:
            break
        await asyncio.sleep(0.02)
    assert counter("grpc_server_handled_total", **labels, grpc_code="CANCELLED") == before + 1
    assert counter("grpc_server_handled_total", **labels, grpc_code="INTERNAL") == 0
