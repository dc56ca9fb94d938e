"""The gateway's HTTP application: one handler that reads a gRPC-web or Connect request, forwards
the message bytes to the table or wallet over gRPC, and writes the answer back in the caller's
protocol.

The gateway holds no state, and no key but its own: the caller's ``authorization`` header goes
through as gRPC metadata and the services decide, as for any gRPC client; the gateway adds the
client's address and its own token, which vouches for it (backbone/clientaddress.py). Messages are parsed here only to
refuse malformed ones with INVALID_ARGUMENT (a gRPC server would answer INTERNAL for bytes it
cannot decode) and to translate Connect's JSON; the bytes forwarded are the caller's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import mimetypes
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from backbone import tracing
from backbone.auth import ServiceCredentials
from backbone.clientaddress import forwarding_metadata
from backbone.errors import REASON_METADATA_KEY
from backbone.grpcserver import overflowed_field
from services.gateway import metrics, protocol
from services.gateway.cors import cors_headers, preflight
from services.gateway.limits import Network, StreamSlots, client_address, token_subject
from services.gateway.methods import Method, exposed
from services.gateway.protocol import ProtocolError, Status

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024
DEFAULT_MAX_STREAMS = 1000
DEFAULT_MAX_STREAMS_PER_ADDRESS = 100  # a household or an office behind one address
DEFAULT_MAX_STREAMS_PER_CALLER = 8  # a player's tabs and devices
DEFAULT_UNARY_TIMEOUT_S = 30.0
DEFAULT_READ_TIMEOUT_S = 10.0
# Above the keep-alive timeout of a proxy in front (ingress-nginx keeps idle upstream connections
# 60 s): a gateway that closed first could drop a request the proxy sends on a connection it reuses.
DEFAULT_IDLE_TIMEOUT_S = 65.0
MAX_TIMEOUT_S = 3600.0
# What a browser may send (answered to a CORS preflight) and read (exposed) besides the simple headers.
FORWARDED_METADATA = ("authorization", "x-correlation-id")
# Every header the gateway reads or forwards: printable ASCII only (gRPC metadata takes nothing else).
READ_HEADERS = (
    *FORWARDED_METADATA,
    "origin",
    "content-type",
    "accept",
    "grpc-timeout",
    "connect-timeout-ms",
    "connect-protocol-version",
    "access-control-request-method",
    "x-forwarded-for",
)

STATIC_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")  # a plain file name: no path, no dot file

GRPC_WEB_TYPES = {"application/grpc-web", "application/grpc-web+proto"}
GRPC_WEB_TEXT_TYPES = {"application/grpc-web-text", "application/grpc-web-text+proto"}
CONNECT_UNARY_TYPES = {"application/proto", "application/json"}
CONNECT_STREAM_TYPES = {"application/connect+proto", "application/connect+json"}


class SlowBody(Exception):
    """The request's body did not arrive within the read timeout."""


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    # Exact origins ("https://play.example.com"), an origin with any port ("http://127.0.0.1:*"), or "*".
    allowed_origins: Sequence[str] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_streams: int = DEFAULT_MAX_STREAMS
    max_streams_per_address: int = DEFAULT_MAX_STREAMS_PER_ADDRESS
    max_streams_per_caller: int = DEFAULT_MAX_STREAMS_PER_CALLER
    # Proxies whose X-Forwarded-For names the client (limits.client_address); none: the peer is the client.
    trusted_proxies: tuple[Network, ...] = ()
    unary_timeout_s: float = DEFAULT_UNARY_TIMEOUT_S
    # A request's body must have arrived this long after its headers.
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    # A connection is closed when no request's headers have arrived this long after it opened or after
    # its last answer: an idle connection, and one sending its headers too slowly (server.http_runner).
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    # A directory of static files (the reference web table's build) served at GET / and
    # GET /<file>, so a page can be same-origin with the API. None: no files.
    static_dir: Path | None = None

    def origin_allowed(self, origin: str) -> bool:
        for allowed in self.allowed_origins:
            if allowed == "*" or allowed == origin:
                return True
            if allowed.endswith(":*"):
                base, _, port = origin.rpartition(":")
                if base == allowed[:-2] and port.isdigit():
                    return True
        return False


@dataclass(frozen=True, slots=True)
class Wire:
    """The caller's protocol, read from its Content-Type (and Accept, for grpc-web-text)."""

    kind: str  # "grpc-web", "connect-unary", "connect-stream"
    content_type: str
    text: bool = False
    json: bool = False

    @classmethod
    def of(cls, request: web.Request) -> Wire | None:
        ct = request.content_type.lower()
        accept = request.headers.get("Accept", "")
        if ct in GRPC_WEB_TYPES or ct in GRPC_WEB_TEXT_TYPES:
            text = ct in GRPC_WEB_TEXT_TYPES or "application/grpc-web-text" in accept
            return cls("grpc-web", "application/grpc-web-text+proto" if text else "application/grpc-web+proto", text)
        if ct in CONNECT_UNARY_TYPES:
            return cls("connect-unary", ct, json=ct.endswith("json"))
        if ct in CONNECT_STREAM_TYPES:
            return cls("connect-stream", ct, json=ct.endswith("json"))
        return None

    @property
    def streaming_envelopes(self) -> bool:
        return self.kind != "connect-unary"


@dataclass(slots=True)
class Call:
    """One call's labels for the metrics, counted once, with the first status it is answered with."""

    method: str
    protocol: str
    counted: bool = False

    def answered(self, status: Status) -> Status:
        if not self.counted:
            self.counted = True
            metrics.CALLS.labels(self.method, self.protocol, status.code.name).inc()
        return status


@dataclass
class Gateway:
    channels: Mapping[str, grpc.aio.Channel]
    config: GatewayConfig = field(default_factory=GatewayConfig)
    methods: dict[str, Method] = field(default_factory=exposed)
    # The gateway's own token, vouching for the client address it forwards (backbone/clientaddress.py).
    credentials: ServiceCredentials | None = None
    slots: StreamSlots = field(init=False)

    def __post_init__(self) -> None:
        config = self.config
        self.slots = StreamSlots(config.max_streams, config.max_streams_per_address, config.max_streams_per_caller)
        metrics.STREAMS_LIMIT.set(config.max_streams)

    def application(self) -> web.Application:
        traced = [tracing.aiohttp_middleware] if tracing.enabled() else []
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=traced)
        app.router.add_get("/healthz", self.health)
        app.router.add_route("*", "/{service}/{method}", self.handle)
        if self.config.static_dir is not None:
            app.router.add_get("/", self.static)
            app.router.add_get("/{name}", self.static)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def static(self, request: web.Request) -> web.StreamResponse:
        """A file directly in the static directory (index.html for /); nothing else, no listing."""
        root = self.config.static_dir
        name = request.match_info.get("name", "index.html")
        if root is None or not STATIC_NAME.fullmatch(name):
            raise web.HTTPNotFound()
        path = root / name
        if not path.is_file():
            raise web.HTTPNotFound()
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        return web.FileResponse(path, headers={"Content-Type": kind, "Cache-Control": "no-cache"})

    # -- the one RPC handler --------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        malformed = protocol.malformed_header(request.headers.items(), READ_HEADERS)
        origin = request.headers.get("Origin") if malformed != "origin" else None
        # A page the gateway served itself (same host) is always allowed; others by configuration.
        same_host = origin is not None and origin.partition("://")[2] == request.host
        if origin is not None and not same_host and not self.config.origin_allowed(origin):
            metrics.HTTP_REFUSED.labels("origin").inc()
            return web.Response(status=403, text="origin not allowed\n")
        cors = cors_headers(origin)
        if malformed is not None:
            metrics.HTTP_REFUSED.labels("header").inc()
            reason = f"MALFORMED_HEADER: {malformed} holds a byte outside printable ASCII"
            return self._http_refusal(400, refusal(grpc.StatusCode.INVALID_ARGUMENT, reason), cors)
        if request.method == "OPTIONS":
            return preflight(request, cors)
        wire = Wire.of(request)
        if wire is None:
            metrics.HTTP_REFUSED.labels("content_type").inc()
            return web.Response(
                status=415,
                headers=cors,
                text="send application/grpc-web(+proto), application/grpc-web-text, application/proto, "
                "application/json or application/connect+proto|json\n",
            )
        if request.method != "POST":
            metrics.HTTP_REFUSED.labels("http_method").inc()
            return web.Response(status=405, headers={**cors, "Allow": "POST, OPTIONS"}, text="POST only\n")
        method = self.methods.get(request.path)
        call = Call(metrics.method_label(request.path, method is not None), wire.kind)
        try:
            if method is None:
                raise ProtocolError(grpc.StatusCode.UNIMPLEMENTED, f"METHOD_NOT_EXPOSED: {request.path[:120]}")
            if method.server_streaming != wire.streaming_envelopes and wire.kind != "grpc-web":
                kind = "a server-streaming" if method.server_streaming else "a unary"
                raise ProtocolError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"WRONG_CONTENT_TYPE: {request.content_type} for {kind} call"
                )
            payload = await self._request_message(request, wire, method)
            metadata, timeout_s = self._call_options(request, method)
        except ProtocolError as error:
            return await self._refuse(request, wire, cors, call.answered(refusal(error.code, error.reason)))
        except SlowBody:
            return await self._too_slow(request, cors, call)
        if method.server_streaming:
            return await self._stream(request, wire, cors, method, payload, metadata, timeout_s, call)
        response = await self._unary(request, wire, cors, method, payload, metadata, timeout_s, call)
        metrics.CALL_SECONDS.labels(call.method).observe(time.perf_counter() - started)
        return response

    # -- reading the request --------------------------------------------------------------------

    async def _request_message(self, request: web.Request, wire: Wire, method: Method) -> bytes:
        version = request.headers.get("Connect-Protocol-Version")
        if wire.kind != "grpc-web" and version not in (None, "1"):
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "UNSUPPORTED_PROTOCOL_VERSION: send 1")
        if request.content_length is not None and request.content_length > self.config.max_body_bytes:
            raise ProtocolError(grpc.StatusCode.RESOURCE_EXHAUSTED, self._too_large())
        try:
            async with asyncio.timeout(self.config.read_timeout_s):
                body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ProtocolError(grpc.StatusCode.RESOURCE_EXHAUSTED, self._too_large()) from None
        except TimeoutError:
            raise SlowBody from None
        if wire.text:
            body = protocol.decode_text(body)
        raw = body if wire.kind == "connect-unary" else protocol.single_message(body)
        return self._checked(raw, wire, method)

    def _too_large(self) -> str:
        return f"REQUEST_TOO_LARGE: at most {self.config.max_body_bytes} bytes"

    @staticmethod
    def _checked(raw: bytes, wire: Wire, method: Method) -> bytes:
        message = method.request()
        try:
            if wire.json:
                json_format.Parse(raw.decode("utf-8") or "{}", message, ignore_unknown_fields=True)
                return message.SerializeToString()
            message.ParseFromString(raw)
            overflowed = overflowed_field(raw, method.request)
        except (json_format.ParseError, UnicodeDecodeError, DecodeError, RecursionError) as error:
            reason = str(error).splitlines()[0][:120] if str(error) else type(error).__name__
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, f"MALFORMED_MESSAGE: {reason}") from None
        if overflowed is not None:
            # Protobuf would keep the low bits: an amount of 2^64 + 5 would go on as 5.
            reason = f"INTEGER_OVERFLOW: {overflowed[:120]} holds a value wider than its type"
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, reason)
        return raw

    def _call_options(self, request: web.Request, method: Method) -> tuple[list[tuple[str, str]], float | None]:
        metadata = [(key, request.headers[key]) for key in FORWARDED_METADATA if key in request.headers]
        metadata += forwarding_metadata(self.credentials, self._client_address(request))
        timeout_s: float | None = None if method.server_streaming else self.config.unary_timeout_s
        if "grpc-timeout" in request.headers:
            timeout_s = protocol.parse_grpc_timeout(request.headers["grpc-timeout"])
        elif "connect-timeout-ms" in request.headers:
            timeout_s = protocol.parse_connect_timeout(request.headers["connect-timeout-ms"])
        if timeout_s is not None:
            timeout_s = min(timeout_s, MAX_TIMEOUT_S if method.server_streaming else self.config.unary_timeout_s)
        return metadata, timeout_s

    def _client_address(self, request: web.Request) -> str:
        return client_address(request.remote, request.headers.get("x-forwarded-for"), self.config.trusted_proxies)

    # -- answering ------------------------------------------------------------------------------

    async def _unary(
        self,
        request: web.Request,
        wire: Wire,
        cors: dict[str, str],
        method: Method,
        payload: bytes,
        metadata: list[tuple[str, str]],
        timeout_s: float | None,
        counted: Call,
    ) -> web.StreamResponse:
        unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self.channels[method.upstream].unary_unary(method.path)
        call = unary(payload, metadata=metadata, timeout=timeout_s)
        try:
            reply: bytes = await call
            initial = list(await call.initial_metadata() or ())
            status = Status(grpc.StatusCode.OK, "", list(await call.trailing_metadata() or ()))
        except grpc.aio.AioRpcError as error:
            initial = list(error.initial_metadata() or ())
            status = upstream_status(error, method)
            reply = b""
        counted.answered(status)
        headers = {**cors, **dict(protocol.response_headers(initial))}
        if wire.kind == "connect-unary":
            if not status.ok:
                return self._connect_error(headers, status)
            body = self._render(reply, wire, method) if wire.json else reply
            headers.update(protocol.response_headers(status.trailers, prefix="trailer-"))
            return web.Response(body=body, headers=headers, content_type=wire.content_type)
        response = self._open(wire, headers)
        await response.prepare(request)
        if status.ok:
            await response.write(self._encode(protocol.frame(reply), wire))
        await response.write(self._encode(protocol.grpc_web_trailers(status), wire))
        await response.write_eof()
        return response

    async def _stream(
        self,
        request: web.Request,
        wire: Wire,
        cors: dict[str, str],
        method: Method,
        payload: bytes,
        metadata: list[tuple[str, str]],
        timeout_s: float | None,
        counted: Call,
    ) -> web.StreamResponse:
        address = self._client_address(request)
        try:
            slot = self.slots.take(address, token_subject(request.headers.get("authorization")))
        except ProtocolError as error:
            return await self._refuse(request, wire, cors, counted.answered(refusal(error.code, error.reason)))
        metrics.STREAMS_OPEN.inc()
        streaming: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = self.channels[method.upstream].unary_stream(
            method.path
        )
        call = streaming(payload, metadata=metadata, timeout=timeout_s)
        response = self._open(wire, cors)
        try:
            await response.prepare(request)
            try:
                async for reply in call:
                    slot.verified()
                    body = self._render(reply, wire, method) if wire.json else reply
                    await response.write(self._encode(protocol.frame(body), wire))
                status = Status(grpc.StatusCode.OK, "", list(await call.trailing_metadata() or ()))
            except grpc.aio.AioRpcError as error:
                status = upstream_status(error, method)
            except ProtocolError as error:
                status = Status(error.code, error.reason)
            counted.answered(status)
            await response.write(self._end(status, wire))
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            log.debug("gateway: %s caller went away", method.path)
            counted.answered(Status(grpc.StatusCode.CANCELLED, "the caller went away"))
            raise
        finally:
            slot.release()
            metrics.STREAMS_OPEN.dec()
            call.cancel()
        return response

    async def _refuse(
        self, request: web.Request, wire: Wire, cors: dict[str, str], status: Status
    ) -> web.StreamResponse:
        if wire.kind == "connect-unary":
            return self._connect_error(cors, status)
        response = self._open(wire, cors)
        await response.prepare(request)
        await response.write(self._end(status, wire))
        await response.write_eof()
        return response

    async def _too_slow(self, request: web.Request, cors: dict[str, str], call: Call) -> web.StreamResponse:
        """A body that did not arrive within the read timeout: HTTP 408, and the connection is closed
        at once rather than kept reading whatever the client still trickles in."""
        metrics.HTTP_REFUSED.labels("read_timeout").inc()
        limit = f"REQUEST_TIMEOUT: the body did not arrive within {self.config.read_timeout_s:g} s"
        response = self._http_refusal(408, call.answered(Status(grpc.StatusCode.DEADLINE_EXCEEDED, limit)), cors)
        response.force_close()
        await response.prepare(request)
        await response.write_eof()
        request.protocol.force_close()
        return response

    @staticmethod
    def _http_refusal(http_status: int, status: Status, cors: Mapping[str, str]) -> web.Response:
        """A refusal as an HTTP status, readable by every protocol: Connect's JSON error as the body,
        gRPC-web's status in the headers (a trailers-only answer)."""
        headers = {
            **cors,
            "grpc-status": str(status.code.value[0]),
            "grpc-message": protocol.percent_encode(status.message),
        }
        error = protocol.connect_error(status)[1]
        return web.Response(
            status=http_status, headers=headers, text=json.dumps(error), content_type="application/json"
        )

    def _end(self, status: Status, wire: Wire) -> bytes:
        if wire.kind == "connect-stream":
            return protocol.connect_end_stream(status)
        return self._encode(protocol.grpc_web_trailers(status), wire)

    @staticmethod
    def _connect_error(headers: Mapping[str, str], status: Status) -> web.Response:
        http_status, error = protocol.connect_error(status)
        merged = {**headers, **dict(protocol.response_headers(status.trailers))}
        return web.Response(status=http_status, headers=merged, text=json.dumps(error), content_type="application/json")

    @staticmethod
    def _open(wire: Wire, headers: Mapping[str, str]) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={**headers, "Cache-Control": "no-store"})
        response.content_type = wire.content_type
        return response

    @staticmethod
    def _encode(data: bytes, wire: Wire) -> bytes:
        return base64.b64encode(data) if wire.text else data

    @staticmethod
    def _render(reply: bytes, wire: Wire, method: Method) -> bytes:
        message: Message = method.response.FromString(reply)
        return json_format.MessageToJson(message, indent=None).encode()


def upstream_status(error: grpc.aio.AioRpcError, method: Method) -> Status:
    """The service's status as it sent it; the channel's own failures (the service unreachable)
    without the internal addresses gRPC puts in their text."""
    trailers = list(error.trailing_metadata() or ())
    answered = any(key == REASON_METADATA_KEY for key, _ in trailers)
    if error.code() == grpc.StatusCode.UNAVAILABLE and not answered:
        return refusal(
            grpc.StatusCode.UNAVAILABLE, f"SERVICE_UNAVAILABLE: the {method.upstream} service cannot be reached"
        )
    return Status(error.code(), error.details() or "", trailers)


def refusal(code: grpc.StatusCode, message: str) -> Status:
    """The gateway's own refusal, shaped as the services' are: the reason code heads the
    message ("METHOD_NOT_EXPOSED: ...") and travels in ``niuniu-reason`` metadata, so a client
    reads one place whoever refused."""
    return Status(code, message, ((REASON_METADATA_KEY, message.split(":", 1)[0]),))


async def close_quietly(channels: Mapping[str, grpc.aio.Channel]) -> None:
    for channel in channels.values():
        with contextlib.suppress(Exception):
            await channel.close()
