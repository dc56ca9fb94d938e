"""Wire formats of gRPC-web and of the Connect protocol, and the mapping of gRPC status onto them.

gRPC-web (grpc/grpc doc/PROTOCOL-WEB.md): the gRPC length-prefixed frames over any HTTP
version, the status sent as a last frame (flag 0x80) holding HTTP/1-style header lines;
``application/grpc-web-text`` is the same byte stream base64-encoded (each flushed chunk
padded on its own).

Connect (connectrpc.com/docs/protocol): a unary call is a bare message body
(``application/proto`` or ``application/json``) answered with HTTP 200, or with an HTTP
status and a JSON error ``{"code", "message"}``; trailers go in headers named
``trailer-<key>``. A streaming call uses ``application/connect+proto|json`` envelopes (flag
byte, 4-byte big-endian length) and ends with an end-of-stream envelope (flag 0x02)
holding ``{"error": ..., "metadata": ...}`` as JSON.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import grpc

FRAME_HEADER = struct.Struct(">BI")
GRPC_WEB_TRAILERS_FLAG = 0x80
COMPRESSED_FLAG = 0x01
CONNECT_END_STREAM_FLAG = 0x02

# Connect's names for the codes (connectrpc.com/docs/protocol#error-codes), with their HTTP statuses.
CONNECT_CODES: dict[grpc.StatusCode, tuple[str, int]] = {
    grpc.StatusCode.CANCELLED: ("canceled", 499),
    grpc.StatusCode.UNKNOWN: ("unknown", 500),
    grpc.StatusCode.INVALID_ARGUMENT: ("invalid_argument", 400),
    grpc.StatusCode.DEADLINE_EXCEEDED: ("deadline_exceeded", 504),
    grpc.StatusCode.NOT_FOUND: ("not_found", 404),
    grpc.StatusCode.ALREADY_EXISTS: ("already_exists", 409),
    grpc.StatusCode.PERMISSION_DENIED: ("permission_denied", 403),
    grpc.StatusCode.RESOURCE_EXHAUSTED: ("resource_exhausted", 429),
    grpc.StatusCode.FAILED_PRECONDITION: ("failed_precondition", 400),
    grpc.StatusCode.ABORTED: ("aborted", 409),
    grpc.StatusCode.OUT_OF_RANGE: ("out_of_range", 400),
    grpc.StatusCode.UNIMPLEMENTED: ("unimplemented", 501),
    grpc.StatusCode.INTERNAL: ("internal", 500),
    grpc.StatusCode.UNAVAILABLE: ("unavailable", 503),
    grpc.StatusCode.DATA_LOSS: ("data_loss", 500),
    grpc.StatusCode.UNAUTHENTICATED: ("unauthenticated", 401),
}

Metadata = Sequence[tuple[str, str | bytes]]


class ProtocolError(Exception):
    """A request the gateway cannot read; answered with ``code`` and a short reason, never forwarded."""

    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Status:
    code: grpc.StatusCode
    message: str = ""
    trailers: Metadata = ()

    @property
    def ok(self) -> bool:
        return self.code == grpc.StatusCode.OK


def frame(payload: bytes, flag: int = 0) -> bytes:
    return FRAME_HEADER.pack(flag, len(payload)) + payload


def single_message(body: bytes) -> bytes:
    """The one message of a unary or server-streaming request body made of length-prefixed frames."""
    if len(body) < FRAME_HEADER.size:
        raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_FRAME: the body holds no message frame")
    flag, length = FRAME_HEADER.unpack_from(body)
    if flag & COMPRESSED_FLAG:
        raise ProtocolError(grpc.StatusCode.UNIMPLEMENTED, "COMPRESSION_NOT_SUPPORTED: send messages uncompressed")
    if flag != 0:
        raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, f"MALFORMED_FRAME: unexpected frame flag {flag:#04x}")
    if len(body) != FRAME_HEADER.size + length:
        raise ProtocolError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"MALFORMED_FRAME: the frame announces {length} bytes, the body holds {len(body) - FRAME_HEADER.size}",
        )
    return body[FRAME_HEADER.size :]


_B64_CHUNK = re.compile(rb"[A-Za-z0-9+/]*={0,2}")


def decode_text(body: bytes) -> bytes:
    """grpc-web-text: base64, possibly several padded chunks one after another."""
    compact = re.sub(rb"\s+", b"", body)
    out = bytearray()
    position = 0
    try:
        while position < len(compact):
            match = _B64_CHUNK.match(compact, position)
            if match is None or match.end() == position:
                raise binascii.Error("not base64")
            out += base64.b64decode(match.group(), validate=True)
            position = match.end()
    except (binascii.Error, ValueError):
        raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_BODY: the body is not base64") from None
    return bytes(out)


def percent_encode(message: str) -> str:
    # gRPC's grpc-message: UTF-8, every byte outside printable ASCII (and '%') percent-encoded.
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in message.encode())


def metadata_value(value: str | bytes) -> str:
    return base64.b64encode(value).decode() if isinstance(value, bytes) else value


def grpc_web_trailers(status: Status) -> bytes:
    lines = [f"grpc-status: {status.code.value[0]}", f"grpc-message: {percent_encode(status.message)}"]
    lines += [f"{key}: {metadata_value(value)}" for key, value in status.trailers if _safe_header(key, value)]
    return frame("".join(line + "\r\n" for line in lines).encode(), GRPC_WEB_TRAILERS_FLAG)


def connect_error(status: Status) -> tuple[int, dict[str, str]]:
    name, http_status = CONNECT_CODES.get(status.code, ("unknown", 500))
    return http_status, {"code": name, "message": status.message}


def connect_end_stream(status: Status) -> bytes:
    end: dict[str, object] = {}
    if not status.ok:
        end["error"] = connect_error(status)[1]
    metadata: dict[str, list[str]] = {}
    for key, value in status.trailers:
        if _safe_header(key, value):
            metadata.setdefault(key, []).append(metadata_value(value))
    if metadata:
        end["metadata"] = metadata
    return frame(json.dumps(end).encode(), CONNECT_END_STREAM_FLAG)


def connect_status_from(code_name: str) -> grpc.StatusCode:
    for code, (name, _) in CONNECT_CODES.items():
        if name == code_name:
            return code
    return grpc.StatusCode.UNKNOWN


_TOKEN = re.compile(r"[a-z0-9\-_.]+")


def _safe_header(key: str, value: str | bytes) -> bool:
    """Metadata forwarded to a browser: well-formed names, no line breaks, gRPC's own fields excluded."""
    if not _TOKEN.fullmatch(key) or key.startswith(("grpc-", ":")):
        return False
    return isinstance(value, bytes) or ("\r" not in value and "\n" not in value)


_PRINTABLE = re.compile(r"[\x20-\x7e]*")


def malformed_header(headers: Iterable[tuple[str, str]], names: Iterable[str]) -> str | None:
    """The first header named in ``names`` (lower case) whose value, in any of its occurrences, holds
    anything but printable ASCII (a byte above 0x7E, a tab): gRPC metadata cannot carry it, and no
    header the gateway reads needs it."""
    wanted = set(names)
    for key, value in headers:
        if key.lower() in wanted and _PRINTABLE.fullmatch(value) is None:
            return key.lower()
    return None


def response_headers(metadata: Iterable[tuple[str, str | bytes]], prefix: str = "") -> list[tuple[str, str]]:
    return [(prefix + key, metadata_value(value)) for key, value in metadata if _safe_header(key, value)]


_TIMEOUT_UNITS_S = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_GRPC_TIMEOUT = re.compile(r"([0-9]{1,8})([HMSmun])")


def parse_grpc_timeout(value: str) -> float:
    match = _GRPC_TIMEOUT.fullmatch(value)
    if match is None:
        raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_TIMEOUT: grpc-timeout is <1-8 digits><unit>")
    return int(match.group(1)) * _TIMEOUT_UNITS_S[match.group(2)]


_CONNECT_TIMEOUT = re.compile(r"[0-9]{1,10}")


def parse_connect_timeout(value: str) -> float:
    if _CONNECT_TIMEOUT.fullmatch(value) is None:
        raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_TIMEOUT: connect-timeout-ms is 1-10 digits")
    return int(value) / 1000
