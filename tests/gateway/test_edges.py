"""The gateway's edges, in-process and without the services (their addresses refuse connections): what
it refuses before forwarding anything (header bytes, overflowed integers), how long it lets a
connection idle or trickle, and how it shares its streams between addresses and callers."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import struct
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from aiohttp import web
from niuniu.table.v1 import table_pb2

from backbone.auth import Role, Tokens
from backbone.config import ConfigError
from services.gateway.app import Gateway, GatewayConfig
from services.gateway.limits import StreamSlots, client_address, token_subject, trusted_networks
from services.gateway.protocol import ProtocolError
from services.gateway.server import config_from_env, http_runner

ORIGIN = "http://table.example.test"
WALLET = "/niuniu.wallet.v1.Wallet/"
TABLE = "/niuniu.table.v1.Table/"
SLACK_S = 1.0  # what a timer and a loaded machine may add to a bound


def frame(payload: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(payload)) + payload


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])


@contextlib.asynccontextmanager
async def serving(config: GatewayConfig) -> AsyncIterator[int]:
    """A gateway on a free loopback port, built as the process builds it (server.http_runner)."""
    channels = {"table": grpc.aio.insecure_channel("127.0.0.1:1"), "wallet": grpc.aio.insecure_channel("127.0.0.1:1")}
    runner = http_runner(Gateway(channels, config))
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()
        for channel in channels.values():
            await channel.close()


async def exchange(port: int, request: bytes) -> bytes:
    """One raw HTTP/1.1 request (bytes a client library would not send) and everything answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def post(path: str, content_type: str, body: bytes, *headers: bytes) -> bytes:
    lines = [f"POST {path} HTTP/1.1".encode(), b"Host: gw.test", b"Connection: close"]
    lines += [b"Content-Type: " + content_type.encode(), b"Content-Length: " + str(len(body)).encode(), *headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def parse(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize(
    "header",
    [
        "Authorization: Bearer é".encode(),  # UTF-8
        b"Authorization: Bearer \xff\xfe",  # not even UTF-8
        "X-Correlation-Id: 下注".encode(),
        b"X-Correlation-Id: a\tb",  # a tab is legal HTTP, not gRPC metadata
        b"Connect-Timeout-Ms: \xc2\xb2",  # a superscript two: a digit to str.isdigit()
        "Origin: http://é.test".encode(),
    ],
)
async def test_a_header_byte_outside_printable_ascii_is_400_never_500(header: bytes) -> None:
    name = header.partition(b":")[0].decode().lower()
    async with serving(GatewayConfig(allowed_origins=("*",))) as port:
        for content_type, body in (("application/json", b"{}"), ("application/grpc-web+proto", frame(b""))):
            status, headers, answer = parse(
                await exchange(port, post(WALLET + "GetProfile", content_type, body, header))
            )
            assert status == 400, answer
            assert headers["grpc-status"] == "3" and f"MALFORMED_HEADER: {name}" in headers["grpc-message"]
            assert json.loads(answer) == {
                "code": "invalid_argument",
                "message": f"MALFORMED_HEADER: {name} holds a byte outside printable ASCII",
            }


async def test_a_refused_header_still_carries_cors_for_an_allowed_page() -> None:
    async with serving(GatewayConfig(allowed_origins=(ORIGIN,))) as port:
        request = post(WALLET + "GetProfile", "application/json", b"{}", b"Origin: " + ORIGIN.encode(),
                       b"Authorization: Bearer \xe9")  # fmt: skip
        status, headers, _ = parse(await exchange(port, request))
    assert status == 400 and headers["access-control-allow-origin"] == ORIGIN


async def test_an_integer_that_overflowed_is_refused_before_it_is_forwarded() -> None:
    """PlaceBet's amount_minor (field 5) sent as 2^64 + 5: protobuf would read 5. The services are
    unreachable here, so an answer other than UNAVAILABLE is the gateway's own."""
    amount = table_pb2.PlaceBetRequest.DESCRIPTOR.fields_by_name["amount_minor"].number
    raw = table_pb2.PlaceBetRequest(command_id="c-1", table_id="t", area="area_1").SerializeToString()
    raw += varint(amount << 3) + varint(2**64 + 5)
    assert table_pb2.PlaceBetRequest.FromString(raw).amount_minor == 5
    async with serving(GatewayConfig()) as port:
        status, _, body = parse(await exchange(port, post(TABLE + "PlaceBet", "application/proto", raw)))
        assert status == 400 and json.loads(body)["code"] == "invalid_argument"
        assert json.loads(body)["message"].startswith("INTEGER_OVERFLOW: amount_minor"), body
        status, _, body = parse(
            await exchange(port, post(TABLE + "PlaceBet", "application/grpc-web+proto", frame(raw)))
        )
        assert status == 200 and b"grpc-status: 3" in body and b"INTEGER_OVERFLOW" in body, body
        # The same call with an amount that fits is forwarded (and finds no service).
        fits = table_pb2.PlaceBetRequest(command_id="c-1", amount_minor=2**63 - 1).SerializeToString()
        status, _, body = parse(await exchange(port, post(TABLE + "PlaceBet", "application/proto", fits)))
        assert status == 503 and json.loads(body)["code"] == "unavailable"
    # Connect JSON cannot overflow unseen: protobuf's JSON parser refuses the number itself.
    async with serving(GatewayConfig()) as port:
        too_big = json.dumps({"commandId": "c-1", "amountMinor": str(2**64 + 5)}).encode()
        status, _, body = parse(await exchange(port, post(TABLE + "PlaceBet", "application/json", too_big)))
    assert status == 400 and "MALFORMED_MESSAGE" in json.loads(body)["message"]


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    with contextlib.suppress(ConnectionError):
        return await asyncio.wait_for(reader.read(), 30)
    return b""


async def trickle(writer: asyncio.StreamWriter, data: bytes, every_s: float) -> None:
    """A slow-loris: one byte at a time, until done or the gateway hangs up."""
    with contextlib.suppress(ConnectionError):
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(every_s)


async def test_an_idle_or_slow_connection_is_closed_within_the_bound() -> None:
    config = GatewayConfig(idle_timeout_s=1.0, read_timeout_s=1.0)
    head = post(WALLET + "Login", "application/json", b"{}" * 50)
    headers_end = head.index(b"\r\n\r\n") + 4
    async with serving(config) as port:
        # Nothing sent at all.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        assert await read_until_closed(reader) == b""
        assert time.monotonic() - started < config.idle_timeout_s + SLACK_S
        writer.close()
        # Headers sent a byte every 0.1 s: never complete in time, closed unanswered.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        sending = asyncio.create_task(trickle(writer, head[:headers_end], 0.1))
        assert await read_until_closed(reader) == b""
        assert time.monotonic() - started < config.idle_timeout_s + SLACK_S
        sending.cancel()
        writer.close()
        # Headers at once, then the body a byte every 0.1 s: HTTP 408 once the read timeout passes.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head[:headers_end])
        started = time.monotonic()
        sending = asyncio.create_task(trickle(writer, head[headers_end:], 0.1))
        status, _, body = parse(await read_until_closed(reader))
        assert status == 408 and json.loads(body)["message"].startswith("REQUEST_TIMEOUT"), body
        assert time.monotonic() - started < config.read_timeout_s + SLACK_S
        await asyncio.wait_for(sending, 5)  # the gateway hung up: the trickle stopped
        writer.close()


async def test_a_connection_kept_alive_is_closed_once_idle_for_the_bound() -> None:
    async with serving(GatewayConfig(idle_timeout_s=1.0)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: gw.test\r\n\r\n")
        await writer.drain()
        assert (await reader.readuntil(b"ok\n")).startswith(b"HTTP/1.1 200")
        answered = time.monotonic()
        assert await read_until_closed(reader) == b""
        assert 0.5 < time.monotonic() - answered < 1.0 + SLACK_S
        writer.close()


# -- the stream slots -----------------------------------------------------------------------------


def refused(slots: StreamSlots, address: str, caller: str | None) -> str:
    with pytest.raises(ProtocolError) as error:
        slots.take(address, caller)
    assert error.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    return error.value.reason.partition(":")[0]


def test_one_address_and_one_caller_cannot_take_every_slot() -> None:
    slots = StreamSlots(total=5, per_address=3, per_caller=2)
    alice = [slots.take("10.0.0.1", "alice") for _ in range(2)]
    for slot in alice:
        slot.verified()
    assert refused(slots, "10.0.0.2", "alice") == "TOO_MANY_STREAMS_PER_CALLER"  # from anywhere
    bob = slots.take("10.0.0.1", "bob")
    assert refused(slots, "10.0.0.1", "carol") == "TOO_MANY_STREAMS_PER_ADDRESS"
    others = [slots.take("10.0.0.2", "carol"), slots.take("10.0.0.3", None)]
    assert refused(slots, "10.0.0.4", "dave") == "TOO_MANY_STREAMS"
    for slot in (*alice, bob, *others):
        slot.release()
        slot.release()  # once only
    assert (slots.open, dict(slots.by_address), dict(slots.by_caller)) == (0, {}, {})


def test_a_stream_counts_against_its_caller_only_once_the_service_answered() -> None:
    """Streams whose token the service has not accepted (forged in alice's name) do not use up
    alice's share; if alice's own streams got there first, the late one is refused on its first message."""
    slots = StreamSlots(total=10, per_address=10, per_caller=1)
    forged = [slots.take("10.0.0.9", "alice") for _ in range(3)]
    mine = slots.take("10.0.0.1", "alice")
    mine.verified()
    assert refused(slots, "10.0.0.9", "alice") == "TOO_MANY_STREAMS_PER_CALLER"
    with pytest.raises(ProtocolError, match="TOO_MANY_STREAMS_PER_CALLER"):
        forged[0].verified()
    for slot in forged:
        slot.release()
    assert slots.by_caller["alice"] == 1 and slots.open == 1


def test_the_client_address_behind_trusted_proxies() -> None:
    proxies = trusted_networks("10.0.0.0/8, fd00::/8")
    assert client_address("203.0.113.7", "198.51.100.1", proxies) == "203.0.113.7"  # not a proxy: ignored
    assert client_address("10.1.2.3", "198.51.100.1, 10.9.9.9", proxies) == "198.51.100.1"
    assert client_address("10.1.2.3", "1.2.3.4, 198.51.100.1", proxies) == "198.51.100.1"  # spoofed left part
    assert client_address("10.1.2.3", "not-an-ip", proxies) == "10.1.2.3"
    assert client_address("10.1.2.3", None, proxies) == "10.1.2.3"
    assert client_address("2001:db8:1:2::5", None, ()) == client_address("2001:db8:1:2:ffff::1", None, ())
    assert client_address("2001:db8:1:2::5", None, ()) == "2001:db8:1:2::/64"
    assert client_address("::ffff:192.0.2.1", None, ()) == "192.0.2.1"
    assert client_address(None, None, ()) == "unknown"
    with pytest.raises(ValueError, match="nope"):
        trusted_networks("10.0.0.0/8,nope")
    assert trusted_networks("") == ()


def test_the_caller_is_the_tokens_subject_read_unchecked() -> None:
    token = Tokens.ephemeral().issue("alice-id", Role.PLAYER)  # signed by a key nobody trusts
    assert token_subject(f"Bearer {token}") == "alice-id"
    for header in (None, "", "Bearer", "Basic abc", "Bearer not.a.jwt", f"Token {token}"):
        assert token_subject(header) is None


def test_the_new_settings_from_the_environment() -> None:
    defaults = config_from_env({})
    assert (defaults.max_streams_per_address, defaults.max_streams_per_caller) == (100, 8)
    assert (defaults.read_timeout_s, defaults.idle_timeout_s, defaults.trusted_proxies) == (10.0, 65.0, ())
    configured = config_from_env(
        {
            "NIUNIU_GATEWAY_MAX_STREAMS_PER_ADDRESS": "3",
            "NIUNIU_GATEWAY_MAX_STREAMS_PER_CALLER": "1",
            "NIUNIU_GATEWAY_READ_TIMEOUT_S": "2",
            "NIUNIU_GATEWAY_IDLE_TIMEOUT_S": "5",
            "NIUNIU_GATEWAY_TRUSTED_PROXIES": "10.0.0.0/8",
        }
    )
    assert (configured.max_streams_per_address, configured.max_streams_per_caller) == (3, 1)
    assert (configured.read_timeout_s, configured.idle_timeout_s) == (2.0, 5.0)
    assert configured.trusted_proxies == (ipaddress.ip_network("10.0.0.0/8"),)
    for name, value in (("NIUNIU_GATEWAY_TRUSTED_PROXIES", "10.0.0.0/33"), ("NIUNIU_GATEWAY_IDLE_TIMEOUT_S", "0")):
        with pytest.raises(ConfigError, match=name):
            config_from_env({name: value})
