"""The interceptors every service's gRPC server runs around its handlers, apart from the error
mapping (backbone/grpcserver.py): the RED metrics and, when tracing is on, a SERVER span per call.
``rebuild`` wraps a handler's behaviour whatever its streaming shape.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from backbone import metrics, tracing

Behavior = Callable[..., Any]
if TYPE_CHECKING:
    MethodHandler: TypeAlias = grpc.RpcMethodHandler[Any, Any]  # generic only in the stubs
else:
    MethodHandler = grpc.RpcMethodHandler
Continuation: TypeAlias = Callable[[grpc.HandlerCallDetails], Awaitable["MethodHandler | None"]]


def rebuild(
    handler: MethodHandler,
    wrap: Callable[[Behavior, bool], Behavior],
    deserializer: Callable[[Callable[[bytes], Any]], Callable[[bytes], Any]] | None = None,
) -> MethodHandler:
    """``handler`` with its behavior wrapped; with ``deserializer``, its unary requests parsed by
    ``deserializer(the handler's own)`` (a streamed request keeps the handler's own)."""
    parse = handler.request_deserializer
    if deserializer is not None and parse is not None and not handler.request_streaming:
        parse = deserializer(parse)
    kwargs = {
        "request_deserializer": parse,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(wrap(handler.unary_unary, False), **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(wrap(handler.unary_stream, True), **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(wrap(handler.stream_unary, False), **kwargs)
    assert handler.stream_stream is not None
    return grpc.stream_stream_rpc_method_handler(wrap(handler.stream_stream, True), **kwargs)


def _split_method(full: str) -> tuple[str, str]:
    _, service, method = full.split("/", 2)
    return service, method


def _rpc_type(handler: MethodHandler) -> str:
    if handler.unary_unary:
        return "unary"
    if handler.unary_stream:
        return "server_stream"
    if handler.stream_unary:
        return "client_stream"
    return "bidi_stream"


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """grpc_server_started_total, grpc_server_handled_total{grpc_code}, grpc_server_handling_seconds."""

    async def intercept_service(
        self,
        continuation: Continuation,
        details: grpc.HandlerCallDetails,
    ) -> MethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return handler
        service, method = _split_method(details.method)
        labels = (service, method, _rpc_type(handler))
        return rebuild(handler, lambda behavior, streaming: self._wrap(behavior, streaming, labels))

    @staticmethod
    def _wrap(behavior: Behavior, streaming: bool, labels: tuple[str, str, str]) -> Behavior:
        def finish(
            context: grpc.aio.ServicerContext[Any, Any], started: float, failed: bool, *, cancelled: bool = False
        ) -> None:
            code = context.code()
            if code is None and (cancelled or context.cancelled()):
                code = grpc.StatusCode.CANCELLED  # the client left (e.g. closed WatchTable): not a server error
            if code is None:
                code = grpc.StatusCode.INTERNAL if failed else grpc.StatusCode.OK
            name = code.name if isinstance(code, grpc.StatusCode) else str(code)
            metrics.GRPC_HANDLED.labels(*labels, name).inc()
            metrics.GRPC_HANDLING_SECONDS.labels(*labels).observe(time.perf_counter() - started)

        if streaming and inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                metrics.GRPC_STARTED.labels(*labels).inc()
                started, failed = time.perf_counter(), False
                try:
                    async for item in behavior(request, context):
                        yield item
                except (asyncio.CancelledError, GeneratorExit):
                    finish(context, started, failed, cancelled=True)
                    raise
                except BaseException:
                    failed = True
                    finish(context, started, failed)
                    raise
                else:
                    finish(context, started, failed)

            return stream

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            metrics.GRPC_STARTED.labels(*labels).inc()
            started = time.perf_counter()
            try:
                reply = await behavior(request, context)
            except asyncio.CancelledError:
                finish(context, started, False, cancelled=True)
                raise
            except BaseException:
                finish(context, started, True)
                raise
            finish(context, started, False)
            return reply

        return unary


class TracingInterceptor(grpc.aio.ServerInterceptor):
    """A SERVER span per call, continuing the caller's trace (backbone/tracing.py); installed only when on."""

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> MethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return handler
        method, metadata = details.method, tuple(details.invocation_metadata or ())
        return rebuild(handler, lambda behavior, streaming: self._wrap(behavior, streaming, method, metadata))

    @staticmethod
    def _wrap(behavior: Behavior, streaming: bool, method: str, metadata: tuple[Any, ...]) -> Behavior:
        if streaming and inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                async with tracing.server_span(method, metadata):
                    async for item in behavior(request, context):
                        yield item

            return stream

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            async with tracing.server_span(method, metadata):
                return await behavior(request, context)

        return unary
