"""OpenTelemetry traces, exported by OTLP/HTTP: off unless ``NIUNIU_OTLP_ENDPOINT`` is set.

With ``NIUNIU_OTLP_ENDPOINT=http://collector:4318`` a process exports its spans to
``<endpoint>/v1/traces`` (batched; ``OTEL_BSP_SCHEDULE_DELAY`` and the other ``OTEL_BSP_*`` settings
apply) as ``service.name`` ``niuniu-<service>``. The trace context (W3C ``traceparent``) travels:

- in gRPC metadata: the client interceptor (every channel of ``backbone.tls.aio_channel``) opens a
  CLIENT span and injects it; the server interceptor (``backbone.grpcserver``) continues it;
- from a command to its events: the event store records the current context on the events' outbox
  rows (``outbox.trace_context``), the relay sends it as the Kafka record's ``traceparent`` header,
  and a consumer opens one CONSUMER span per record under it;
- from the browser gateway: a SERVER span per call, continuing a ``traceparent`` the caller sent.

Off, nothing is installed: no interceptor, no header, no extra statement.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import grpc
from aiohttp import web
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

log = logging.getLogger(__name__)

ENDPOINT_ENV = "NIUNIU_OTLP_ENDPOINT"
TRACEPARENT = "traceparent"
_state = {"enabled": False}
tracer = trace.get_tracer("niuniu")


def configure(service: str, env: Mapping[str, str] | None = None) -> bool:
    """Export this process's spans when ``NIUNIU_OTLP_ENDPOINT`` is set; True if it is."""
    endpoint = (os.environ if env is None else env).get(ENDPOINT_ENV, "").rstrip("/")
    if not endpoint:
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"niuniu-{service}"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")))
    trace.set_tracer_provider(provider)
    _state["enabled"] = True
    log.info("tracing: exporting spans by OTLP", extra={"endpoint": endpoint})
    return True


def enabled() -> bool:
    return _state["enabled"]


def current_traceparent() -> str | None:
    """The current span's ``traceparent``, or None outside a recorded span (or with tracing off)."""
    if not enabled():
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get(TRACEPARENT)


def context_of(pairs: Iterable[tuple[str, Any]]) -> otel_context.Context:
    """The trace context carried by metadata or headers (text or bytes values)."""
    carrier = {str(k).lower(): v.decode() if isinstance(v, bytes) else str(v) for k, v in pairs}
    return propagate.extract(carrier)


def _finish(span: Span, code: grpc.StatusCode | None) -> None:
    if code is not None and code is not grpc.StatusCode.OK:
        span.set_status(Status(StatusCode.ERROR, code.name))
    span.set_attribute("rpc.grpc.status_code", code.value[0] if code is not None else 0)
    span.end()


@asynccontextmanager
async def server_span(method: str, metadata: Iterable[tuple[str, Any]]) -> AsyncIterator[Span]:
    """A SERVER span for one gRPC call, continuing the caller's trace, current while the handler runs."""
    _, service, name = method.split("/", 2)
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
    with tracer.start_as_current_span(
        method.lstrip("/"), context=context_of(metadata), kind=SpanKind.SERVER, attributes=attributes
    ) as span:
        yield span


class ClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    """A CLIENT span per call, its context injected as the call's ``traceparent`` metadata."""

    def _details(self, details: grpc.aio.ClientCallDetails, span: Span) -> grpc.aio.ClientCallDetails:
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *carrier.items())
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    def _span(self, details: grpc.aio.ClientCallDetails) -> Span:
        method = details.method.decode() if isinstance(details.method, bytes) else str(details.method)
        return tracer.start_span(method.lstrip("/"), kind=SpanKind.CLIENT, attributes={"rpc.system": "grpc"})

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        span = self._span(details)
        call = await continuation(self._details(details, span), request)
        _finish(span, await call.code())
        return call

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        span = self._span(details)
        call = await continuation(self._details(details, span), request)
        span.end()  # a stream lasts as long as its watcher: the span marks its opening
        return call


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    return [ClientInterceptor()] if enabled() else []


@web.middleware
async def aiohttp_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """The browser gateway's SERVER span per HTTP request, continuing a ``traceparent`` the caller sent."""
    with tracer.start_as_current_span(
        f"{request.method} {request.path}",
        context=context_of(request.headers.items()),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": request.method, "url.path": request.path},
    ) as span:
        response: web.StreamResponse = await handler(request)
        span.set_attribute("http.response.status_code", response.status)
        return response


@contextmanager
def consumer_spans(name: str, records: Sequence[tuple[str, Iterable[tuple[str, Any]] | None, str]]) -> Iterator[None]:
    """A CONSUMER span for each (topic, headers, event type) that carries a trace context, open meanwhile."""
    spans = [consumer_span(name, topic, headers, event_type) for topic, headers, event_type in records]
    try:
        yield
    finally:
        for span in spans:
            if span is not None:
                span.end()


def consumer_span(name: str, topic: str, headers: Iterable[tuple[str, Any]] | None, event_type: str) -> Span | None:
    """A CONSUMER span for a record that carries a trace context (None for one that does not, or when off)."""
    if not enabled():
        return None
    parent = context_of(headers or ())
    if not trace.get_current_span(parent).get_span_context().is_valid:
        return None
    attributes = {"messaging.system": "kafka", "messaging.destination.name": topic, "niuniu.event_type": event_type}
    return tracer.start_span(f"{name} {topic}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes)
