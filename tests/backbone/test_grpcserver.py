"""The gRPC bootstrap: error mapping, metrics, health, reflection, graceful stop (in-process, port 0)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import kafka.errors
import psycopg
import psycopg.errors
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from niuniu.table.v1 import events_pb2
from niuniu.wallet.v1 import wallet_pb2
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from backbone.config import HealthSettings
from backbone.errors import REASON_METADATA_KEY, InvalidArgument, NotFound, dependency_failure
from backbone.eventstore import ConcurrencyError
from backbone.grpcserver import MAX_SEND_MESSAGE_BYTES, SERVER_OPTIONS, RunningServer, overflowed_field, start_server
from backbone.healthcheck import DependencyMonitor
from backbone.tls import MAX_ANSWER_BYTES, aio_channel

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


def _refusing_port() -> int:
    """A loopback port that refuses connections (bound, never listening) for as long as the module runs."""
    _HELD.bind(("127.0.0.1", 0))
    return int(_HELD.getsockname()[1])


_HELD = socket.socket()
DEAD_PORT = _refusing_port()


async def no_database(request: bytes, context: Any) -> bytes:
    await psycopg.AsyncConnection.connect(f"postgresql://nobody@127.0.0.1:{DEAD_PORT}/none", connect_timeout=2)
    return b""


async def no_redis(request: bytes, context: Any) -> bytes:
    client = Redis.from_url(f"redis://127.0.0.1:{DEAD_PORT}/0", socket_connect_timeout=2)
    try:
        await client.ping()
    finally:
        await client.aclose()
    return b""


async def wrapped(request: bytes, context: Any) -> bytes:
    try:
        await no_database(request, context)
    except psycopg.Error as error:
        raise RuntimeError("could not load the account") from error
    return b""


async def downstream(request: bytes, context: Any) -> bytes:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{DEAD_PORT}") as channel:
        unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(f"/{SERVICE}/Ok")
        return await unary(b"x", timeout=2)


def register(server: grpc.aio.Server) -> Sequence[str]:
    handlers = {
        "Ok": ok,
        "BadInput": bad_input,
        "Missing": missing,
        "Bug": bug,
        "NoDatabase": no_database,
        "NoRedis": no_redis,
        "Wrapped": wrapped,
        "Downstream": downstream,
    }
    unary: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
        name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in handlers.items()
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


@pytest.mark.parametrize(
    ("method", "reason"),
    [
        ("NoDatabase", "DATABASE_UNAVAILABLE"),
        ("NoRedis", "REDIS_UNAVAILABLE"),
        ("Wrapped", "DATABASE_UNAVAILABLE"),
        ("Downstream", "UPSTREAM_UNAVAILABLE"),
    ],
)
async def test_an_unreachable_dependency_is_unavailable_with_a_reason(
    running: RunningServer, method: str, reason: str
) -> None:
    _, error = await call(running.port, method)
    assert error is not None
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
    assert (REASON_METADATA_KEY, reason) in tuple(error.trailing_metadata() or ())
    assert str(DEAD_PORT) not in (error.details() or "")  # the driver's text (hosts, ports) is not sent


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (psycopg.errors.LockNotAvailable("lock"), grpc.StatusCode.UNAVAILABLE, "DATABASE_LOCK_TIMEOUT"),
        (psycopg.errors.QueryCanceled("statement"), grpc.StatusCode.UNAVAILABLE, "DATABASE_TIMEOUT"),
        (psycopg.errors.DeadlockDetected("deadlock"), grpc.StatusCode.ABORTED, "DATABASE_CONFLICT"),
        (ConcurrencyError("table-t1", 7), grpc.StatusCode.ABORTED, "CONCURRENT_UPDATE"),
        (psycopg.errors.AdminShutdown("shutdown"), grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE"),
        (kafka.errors.KafkaConnectionError("down"), grpc.StatusCode.UNAVAILABLE, "BROKER_UNAVAILABLE"),
        (kafka.errors.KafkaTimeoutError("slow"), grpc.StatusCode.UNAVAILABLE, "BROKER_UNAVAILABLE"),
    ],
)
def test_dependency_failures_are_classified(error: Exception, code: grpc.StatusCode, reason: str) -> None:
    mapped = dependency_failure(error)
    assert mapped is not None and (mapped.code, mapped.reason) == (code, reason)


@pytest.mark.parametrize(
    "error",
    [
        KeyError("bug"),
        psycopg.errors.UniqueViolation("a bug too: the handler should have known"),
        kafka.errors.KafkaError("not retriable"),
    ],
)
def test_bugs_are_not_taken_for_dependency_failures(error: Exception) -> None:
    assert dependency_failure(error) is None


class Switch:
    """A probe whose dependency is up, down (raises) or silent (never answers) as the test says."""

    def __init__(self) -> None:
        self.state = "up"

    async def __call__(self) -> None:
        if self.state == "down":
            raise ConnectionRefusedError("refused")
        if self.state == "silent":
            await asyncio.Event().wait()


FAST_PROBES = HealthSettings(probe_interval_ms=50, probe_timeout_ms=200)


@pytest.fixture
async def monitored() -> AsyncIterator[tuple[RunningServer, Switch]]:
    switch = Switch()
    server = await start_server(register, dependencies=DependencyMonitor("test", {"switch": switch}, FAST_PROBES))
    yield server, switch
    await server.stop(0.1)


async def _health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        check: grpc.aio.UnaryUnaryMultiCallable[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse] = (
            channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )
        )
        reply = await check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=1)
        return reply.status


async def _becomes(port: int, status: int) -> None:
    for _ in range(200):  # bounded: 200 x 25 ms
        if await _health(port) == status:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"health never became {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}")


@pytest.mark.parametrize("failure", ["down", "silent"])
async def test_health_follows_the_dependencies(monitored: tuple[RunningServer, Switch], failure: str) -> None:
    server, switch = monitored
    await _becomes(server.port, health_pb2.HealthCheckResponse.SERVING)
    switch.state = failure
    await _becomes(server.port, health_pb2.HealthCheckResponse.NOT_SERVING)
    reply, _ = await call(server.port, "Ok", b"still")  # the server itself goes on answering
    assert reply == b"STILL"
    switch.state = "up"
    await _becomes(server.port, health_pb2.HealthCheckResponse.SERVING)


async def test_a_dependency_returning_during_shutdown_does_not_make_it_serving(
    monitored: tuple[RunningServer, Switch],
) -> None:
    server, switch = monitored
    switch.state = "down"
    await _becomes(server.port, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.health.enter_graceful_shutdown()
    switch.state = "up"
    await asyncio.sleep(0.3)  # several probe rounds
    assert await _health(server.port) == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_the_monitor_names_what_is_down_and_why() -> None:
    up, down, silent = Switch(), Switch(), Switch()
    down.state, silent.state = "down", "silent"
    monitor = DependencyMonitor("test", {"up": up, "down": down, "silent": silent}, FAST_PROBES)
    failing = await monitor.probe_once()
    assert set(failing) == {"down", "silent"}
    assert "ConnectionRefusedError" in failing["down"]
    assert failing["silent"] == "no answer within 0.2 s"
    assert not monitor.healthy
    assert REGISTRY.get_sample_value("niuniu_dependency_up", {"service": "test", "dependency": "up"}) == 1
    assert REGISTRY.get_sample_value("niuniu_dependency_up", {"service": "test", "dependency": "silent"}) == 0


async def test_a_services_channel_takes_an_answer_as_large_as_a_server_sends() -> None:
    """gRPC's clients take 4 MiB by default; the system's servers send up to 16 MiB (a full round's
    RoundJournal is over 4 MiB), and the system's channels (``tls.aio_channel``) take that much."""
    assert MAX_ANSWER_BYTES == MAX_SEND_MESSAGE_BYTES
    answer = b"x" * (MAX_SEND_MESSAGE_BYTES - 1024)

    async def big(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return answer

    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Big", {"Get": grpc.unary_unary_rpc_method_handler(big)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio_channel(f"127.0.0.1:{port}", None, env={}) as channel:
            get: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/test.Big/Get")
            assert await get(b"", timeout=30) == answer
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as default:  # gRPC's own default refuses it
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                get = default.unary_unary("/test.Big/Get")
                await get(b"", timeout=30)
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await server.stop(None)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


@pytest.mark.parametrize(
    ("raw", "message", "overflowed"),
    [
        (
            wallet_pb2.DepositRequest(request_id="下注下注", amount_minor=-1).SerializeToString(),
            wallet_pb2.DepositRequest,
            None,
        ),
        (_field(3, 2**64 - 1), wallet_pb2.DepositRequest, None),
        (_field(3, 2**64 + 5), wallet_pb2.DepositRequest, "amount_minor"),
        (_field(99, 2**64 + 5), wallet_pb2.DepositRequest, "99"),  # an unknown field
        (_field(2, 2**64 - 1), wallet_pb2.ListMovementsRequest, None),  # int32 -1, sign-extended
        (_field(2, 2**31 - 1), wallet_pb2.ListMovementsRequest, None),
        (_field(2, 2**31), wallet_pb2.ListMovementsRequest, "page_size"),
        (_field(2, 2**63), wallet_pb2.ListMovementsRequest, "page_size"),
        (_field(1, _field(3, 2**64 + 5)), wallet_pb2.PlaceHoldsRequest, "holds.amount_minor"),
        (_field(3, _varint(100) + _varint(2**64 + 1)), events_pb2.TableLimits, "chips_minor"),  # packed
        (_field(3, _varint(100) + _varint(2**63)), events_pb2.TableLimits, None),
        # A group (wire types 3 and 4, unknown here) hides nothing after it.
        (
            _varint(9 << 3 | 3) + _field(1, 7) + _varint(9 << 3 | 4) + _field(3, 2**64 + 5),
            wallet_pb2.DepositRequest,
            "amount_minor",
        ),
    ],
)
def test_an_integer_that_overflowed_on_the_wire_is_found(
    raw: bytes, message: type[Message], overflowed: str | None
) -> None:
    message.FromString(raw)  # well-formed: protobuf reads it, keeping the low bits
    assert overflowed_field(raw, message) == overflowed
