"""gRPC server bootstrap shared by every service.

Servicers stay thin: proto in, command to the application, proto out. This
module adds what every service needs around them: health checking and
reflection, the interceptor that maps domain errors to status codes (bad input
never comes back as UNKNOWN; an integer that overflowed on the wire or a NUL in a
text is INVALID_ARGUMENT before a handler runs), the RED metrics interceptor, correlation ids in
the logs, and a graceful shutdown (health NOT_SERVING first, then
``server.stop(grace)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
import signal
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from backbone import logs, tracing
from backbone.config import GrpcSettings
from backbone.errors import (
    MAX_MESSAGE_CHARS,
    MAX_REASON_CHARS,
    REASON_METADATA_KEY,
    DomainError,
    InvalidArgument,
    bounded,
    dependency_failure,
)
from backbone.healthcheck import DependencyMonitor
from backbone.interceptors import Behavior, Continuation, MethodHandler, MetricsInterceptor, TracingInterceptor, rebuild
from backbone.tls import MAX_ANSWER_BYTES

log = logging.getLogger(__name__)

CORRELATION_METADATA_KEY = "x-correlation-id"
MAX_TEXT_CHECK_DEPTH = 8
MAX_RECEIVE_MESSAGE_BYTES = 4 * 1024 * 1024
"""The largest request a server reads (gRPC's default, set explicitly): larger ones are
RESOURCE_EXHAUSTED before any handler runs."""
MAX_SEND_MESSAGE_BYTES = MAX_ANSWER_BYTES
"""The largest answer a server sends: what the system's channels take (``tls.MAX_ANSWER_BYTES``); a full
page of a listing stays far below it."""
SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_SEND_MESSAGE_BYTES),
)


def server_options(env: Mapping[str, str] | None = None) -> tuple[tuple[str, int], ...]:
    """``SERVER_OPTIONS`` and a maximum connection age (backbone/config.py ``GrpcSettings``): a client
    reconnects at least that often and resolves the name again, so a pod added meanwhile gets calls."""
    settings = GrpcSettings.from_env(env)
    return (
        *SERVER_OPTIONS,
        ("grpc.max_connection_age_ms", settings.max_connection_age_ms),
        ("grpc.max_connection_age_grace_ms", settings.max_connection_age_grace_ms),
    )


BackgroundTask = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


async def _abort_for(error: BaseException, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    failure = None if isinstance(error, DomainError) else dependency_failure(error)
    if failure is not None:
        # An operating error, not a bug: one line without a traceback, and a retryable status.
        log.warning("dependency failed during an RPC", extra={"reason": failure.reason, "error": repr(error)[:200]})
        error = failure
    if isinstance(error, DomainError):
        # Bounded again here: a subclass or a handler may have built its text around DomainError's own bound.
        reason = bounded(error.reason, MAX_REASON_CHARS)
        details = bounded(str(error), MAX_MESSAGE_CHARS)
        await context.abort(error.code, details, trailing_metadata=((REASON_METADATA_KEY, reason),))
    log.error("unhandled error in RPC", exc_info=error)
    await context.abort(
        grpc.StatusCode.INTERNAL,
        "INTERNAL: unexpected server error; it has been logged",
        trailing_metadata=((REASON_METADATA_KEY, "INTERNAL"),),
    )


def _nul_field(message: Message, depth: int = 0) -> str | None:
    """The name of the first text field of ``message`` (nested, repeated and map ones too) holding a NUL."""
    for fd, value in message.ListFields():
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            values: Iterable[Any] = (part for item in value.items() for part in item)
        elif fd.is_repeated:
            values = value
        else:
            values = (value,)
        for item in values:
            if isinstance(item, str) and "\x00" in item:
                return fd.name
            if isinstance(item, Message) and depth < MAX_TEXT_CHECK_DEPTH:
                inner = _nul_field(item, depth + 1)
                if inner is not None:
                    return f"{fd.name}.{inner}"
    return None


def check_text(request: Any) -> None:
    """INVALID_ARGUMENT for a request with a NUL character in any text: no caller means one, and PostgreSQL
    cannot store it (the query would fail as INTERNAL deep inside a handler)."""
    if isinstance(request, Message):
        name = _nul_field(request)
        if name is not None:
            raise InvalidArgument("TEXT_INVALID", f"{name} contains a NUL character")


_VARINT_TYPES = frozenset(
    (
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_BOOL,
        FieldDescriptor.TYPE_ENUM,
    )
)
_INT32_TYPES = frozenset((FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_ENUM))
_UINT32_TYPES = frozenset((FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_SINT32))
_WIDE_VARINT = re.compile(rb"[\x80-\xff]{4}")
"""Four continuation bytes in a row: the shortest varint that can exceed 28 bits, hence the least a
message with an overflowed integer holds (checked first, so most messages are not walked)."""


def _read_varint(raw: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = raw[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position


def _fits(value: int, field: FieldDescriptor | None) -> bool:
    """Whether protobuf keeps ``value`` as sent: at most 64 bits, and for a 32-bit field a value
    of that field's range (an int32 or enum may be negative, sent sign-extended to 64 bits)."""
    if value >> 64:
        return False
    kind = field.type if field is not None else None
    if kind in _INT32_TYPES:
        return value < 1 << 31 or value >= (1 << 64) - (1 << 31)
    if kind in _UINT32_TYPES:
        return value < 1 << 32
    return True


def _overflow_in(raw: bytes, message: descriptor.Descriptor) -> str | None:
    """The first field of ``raw`` (well-formed: it was parsed) whose integer overflowed, or None.

    Fields of a group (wire types 3 and 4, unknown to proto3) and unknown fields get the 64-bit check only.
    """
    position, groups = 0, 0
    while position < len(raw):
        key, position = _read_varint(raw, position)
        wire = key & 7
        field = None if groups else message.fields_by_number.get(key >> 3)
        name = field.name if field is not None else str(key >> 3)
        if wire == 0:
            value, position = _read_varint(raw, position)
            if not _fits(value, field):
                return name
        elif wire == 2:
            length, position = _read_varint(raw, position)
            inner = _overflow_in_bytes(raw[position : position + length], field)
            position += length
            if inner is not None:
                return f"{name}.{inner}" if inner else name
        else:
            position += {1: 8, 5: 4}.get(wire, 0)
            groups += {3: 1, 4: -1}.get(wire, 0)
    return None


def _overflow_in_bytes(raw: bytes, field: FieldDescriptor | None) -> str | None:
    """In a length-delimited field: a nested message ("" for the field itself in a packed list)."""
    if field is None:
        return None
    if field.message_type is not None:
        return _overflow_in(raw, field.message_type)
    if field.type in _VARINT_TYPES:  # a packed repeated field: varints one after another
        position = 0
        while position < len(raw):
            value, position = _read_varint(raw, position)
            if not _fits(value, field):
                return ""
    return None


def overflowed_field(raw: bytes, kind: type[Message]) -> str | None:
    """The dotted name of the first integer field whose value on the wire does not fit its type.

    Protobuf keeps the low bits of such a value (an amount sent as 2^64 + 5 is read as 5): the
    parsed message cannot tell, only the bytes can. Call on bytes that parsed as ``kind``.
    """
    if _WIDE_VARINT.search(raw) is None:
        return None
    message: descriptor.Descriptor = kind.DESCRIPTOR  # type: ignore[assignment]  # upb's Descriptor is the same
    return _overflow_in(raw, message)


@dataclass(frozen=True, slots=True)
class Overflowed:
    """What a request whose integer overflowed is parsed into: refused before its handler runs."""

    field: str


def _checking_overflow(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(raw: bytes) -> Any:
        request = parse(raw)
        field = overflowed_field(raw, type(request)) if isinstance(request, Message) else None
        return request if field is None else Overflowed(field)

    return deserialize


def check_request(request: Any) -> None:
    """INVALID_ARGUMENT for a request whose integer overflowed (a deserializer that raised would make
    the answer INTERNAL) or whose text holds a NUL."""
    if isinstance(request, Overflowed):
        raise InvalidArgument("INTEGER_OVERFLOW", f"{request.field} holds a value wider than its type")
    check_text(request)


def _is_abort(error: BaseException) -> bool:
    """Already a status (abort) or the client went away (cancel): not an error to map."""
    return isinstance(error, grpc.aio.AbortError | asyncio.CancelledError | GeneratorExit)


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Domain errors become their status code with a reason; anything else INTERNAL."""

    async def intercept_service(
        self,
        continuation: Continuation,
        details: grpc.HandlerCallDetails,
    ) -> MethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return handler
        return rebuild(handler, self._wrap, _checking_overflow)

    @staticmethod
    def _wrap(behavior: Behavior, streaming: bool) -> Behavior:
        if streaming and inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                _bind_correlation(context)
                try:
                    check_request(request)
                    async for item in behavior(request, context):
                        yield item
                except BaseException as error:
                    if _is_abort(error):
                        raise
                    await _abort_for(error, context)

            return stream

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            _bind_correlation(context)
            try:
                check_request(request)
                return await behavior(request, context)
            except BaseException as error:
                if _is_abort(error):
                    raise
                await _abort_for(error, context)

        return unary


def _bind_correlation(context: grpc.aio.ServicerContext[Any, Any]) -> None:
    for key, value in context.invocation_metadata() or ():
        if key == CORRELATION_METADATA_KEY:
            logs.correlation_id.set(str(value))
            return


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_names: Sequence[str]
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def set_serving(self, serving: bool) -> None:
        """Report every service of this server SERVING or NOT_SERVING (ignored once shutting down)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self.service_names]:
            await self.health.set(name, status)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Flip health to NOT_SERVING, stop background work, then let in-flight RPCs finish."""
        await self.health.enter_graceful_shutdown()
        self.stop_event.set()
        await self.server.stop(grace_s)
        for task in self.tasks:
            # A task stuck in a blocking call past the grace period is cancelled.
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(task, timeout=grace_s)


async def start_server(
    register: Callable[[grpc.aio.Server], Sequence[str]],
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    background: Sequence[BackgroundTask] = (),
    reflection_enabled: bool = True,
    hidden_methods: Sequence[str] = (),
    credentials: grpc.ServerCredentials | None = None,
    dependencies: DependencyMonitor | None = None,
) -> RunningServer:
    """Start a server with the project's interceptors; ``port=0`` picks a free port (tests).

    Reflection describes the services without ``hidden_methods`` (full names such as
    ``niuniu.rng.v1.Rng.SetTestDeck``); ``credentials`` (TLS) replace the plaintext port.
    ``dependencies`` turns health NOT_SERVING while a dependency it probes is unreachable.
    """
    traced = [TracingInterceptor()] if tracing.enabled() else []
    interceptors = [*traced, MetricsInterceptor(), ErrorInterceptor()]
    server = grpc.aio.server(interceptors=interceptors, options=server_options())
    names = list(register(server))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if reflection_enabled:
        reflected = [*names, health.SERVICE_NAME, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(reflected, server, pool=_reflection_pool(reflected, hidden_methods))
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    await server.start()
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    running = RunningServer(server, bound, health_servicer, names)
    running.tasks = [asyncio.create_task(task(running.stop_event)) for task in background]
    if dependencies is not None:
        running.tasks.append(asyncio.create_task(dependencies.run(running.stop_event, running.set_serving)))
    return running


def _reflection_pool(service_names: Sequence[str], hidden_methods: Sequence[str]) -> descriptor_pool.DescriptorPool:
    """A copy of the descriptors of ``service_names`` (and their imports) without ``hidden_methods``."""
    source = descriptor_pool.Default()
    hidden = set(hidden_methods)
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: descriptor.FileDescriptor) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        for service_proto in proto.service:
            full = f"{proto.package}.{service_proto.name}" if proto.package else service_proto.name
            kept = [m for m in service_proto.method if f"{full}.{m.name}" not in hidden]
            del service_proto.method[:]
            service_proto.method.extend(kept)
        pool.Add(proto)
        added.add(file.name)

    for name in service_names:
        try:
            add(source.FindServiceByName(name).file)
        except KeyError:  # a generic handler without a descriptor: listed, not described (as before)
            continue
    return pool


async def serve_forever(running: RunningServer, *, grace_s: float = 10.0) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    waiter = asyncio.create_task(stopping.wait())
    done = asyncio.create_task(running.server.wait_for_termination())
    await asyncio.wait({waiter, done}, return_when=asyncio.FIRST_COMPLETED)
    log.info("shutting down", extra={"grace_s": grace_s})
    await running.stop(grace_s)
