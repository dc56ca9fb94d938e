"""The gateway's wire helpers and settings, without a network: framing, text encoding, status
mapping, timeouts, origins and the environment."""

from __future__ import annotations

import base64
import json

import grpc
import pytest

from backbone.config import ConfigError
from services.gateway import protocol
from services.gateway.app import GatewayConfig
from services.gateway.methods import exposed
from services.gateway.protocol import ProtocolError, Status
from services.gateway.server import config_from_env, listen_address


def test_text_bodies_may_be_several_padded_chunks() -> None:
    first, second = protocol.frame(b"ab"), protocol.frame(b"xyz", 0x80)
    joined = base64.b64encode(first) + base64.b64encode(second)  # each chunk padded on its own
    assert protocol.decode_text(joined) == first + second
    with pytest.raises(ProtocolError, match="MALFORMED_BODY"):
        protocol.decode_text(b"ab$d")


def test_one_message_per_request() -> None:
    assert protocol.single_message(protocol.frame(b"hello")) == b"hello"
    for bad, reason in [
        (b"", "MALFORMED_FRAME"),
        (protocol.frame(b"hello")[:-1], "MALFORMED_FRAME"),
        (protocol.frame(b"a") + protocol.frame(b"b"), "MALFORMED_FRAME"),
        (protocol.frame(b"a", 0x80), "MALFORMED_FRAME"),
        (protocol.frame(b"a", 0x01), "COMPRESSION_NOT_SUPPORTED"),
    ]:
        with pytest.raises(ProtocolError, match=reason):
            protocol.single_message(bad)


def test_trailers_carry_the_status_a_percent_encoded_message_and_safe_metadata() -> None:
    status = Status(
        grpc.StatusCode.FAILED_PRECONDITION,
        "BETTING_CLOSED: 100% 下注",
        (("niuniu-reason", "BETTING_CLOSED"), ("bad\nkey", "x"), ("x-evil", "a\r\nb"), ("grpc-internal", "x")),
    )
    flag, length = protocol.FRAME_HEADER.unpack_from(trailer := protocol.grpc_web_trailers(status))
    text = trailer[protocol.FRAME_HEADER.size :].decode()
    assert flag == 0x80 and length == len(trailer) - 5
    assert text.splitlines() == [
        "grpc-status: 9",
        "grpc-message: BETTING_CLOSED: 100%25 %E4%B8%8B%E6%B3%A8",
        "niuniu-reason: BETTING_CLOSED",
    ]


def test_connect_errors_and_end_of_stream() -> None:
    status = Status(grpc.StatusCode.OUT_OF_RANGE, "POSITION_UNKNOWN: x", (("niuniu-reason", "POSITION_UNKNOWN"),))
    assert protocol.connect_error(status) == (400, {"code": "out_of_range", "message": "POSITION_UNKNOWN: x"})
    assert protocol.connect_error(Status(grpc.StatusCode.CANCELLED))[1]["code"] == "canceled"
    end = protocol.connect_end_stream(status)
    assert end[0] == protocol.CONNECT_END_STREAM_FLAG
    assert json.loads(end[5:]) == {
        "error": {"code": "out_of_range", "message": "POSITION_UNKNOWN: x"},
        "metadata": {"niuniu-reason": ["POSITION_UNKNOWN"]},
    }
    assert json.loads(protocol.connect_end_stream(Status(grpc.StatusCode.OK))[5:]) == {}
    assert {code: protocol.connect_status_from(name) for code, (name, _) in protocol.CONNECT_CODES.items()} == {
        code: code for code in protocol.CONNECT_CODES
    }


def test_timeouts() -> None:
    assert protocol.parse_grpc_timeout("1500m") == pytest.approx(1.5)
    assert protocol.parse_grpc_timeout("2S") == 2
    assert protocol.parse_connect_timeout("250") == pytest.approx(0.25)
    for bad in ("", "1x", "123456789S", "-1S"):
        with pytest.raises(ProtocolError, match="MALFORMED_TIMEOUT"):
            protocol.parse_grpc_timeout(bad)
    with pytest.raises(ProtocolError, match="MALFORMED_TIMEOUT"):
        protocol.parse_connect_timeout("1.5")


def test_origins() -> None:
    config = GatewayConfig(allowed_origins=("https://play.example.com", "http://127.0.0.1:*"))
    assert config.origin_allowed("https://play.example.com")
    assert config.origin_allowed("http://127.0.0.1:5173")
    assert not config.origin_allowed("https://play.example.com.evil.test")
    assert not config.origin_allowed("http://127.0.0.1:5173.evil.test")
    assert not config.origin_allowed("http://localhost:5173")
    assert GatewayConfig(allowed_origins=("*",)).origin_allowed("https://anything.test")
    assert not GatewayConfig().origin_allowed("http://127.0.0.1:8080")


def test_settings_from_the_environment() -> None:
    assert config_from_env({}).allowed_origins == ()  # production: no page may call until configured
    development = config_from_env({"NIUNIU_ENV": "development"})
    assert development.origin_allowed("http://localhost:3000") and not development.origin_allowed("https://x.test")
    configured = config_from_env({"NIUNIU_ENV": "development", "NIUNIU_GATEWAY_CORS_ORIGINS": "https://a.test/, "})
    assert configured.allowed_origins == ("https://a.test",)
    assert config_from_env({"NIUNIU_GATEWAY_STATIC_DIR": ""}).static_dir is None
    with pytest.raises(ConfigError, match="NIUNIU_GATEWAY_MAX_STREAMS"):
        config_from_env({"NIUNIU_GATEWAY_MAX_STREAMS": "0"})
    with pytest.raises(ConfigError, match="NIUNIU_GATEWAY_STATIC_DIR"):
        config_from_env({"NIUNIU_GATEWAY_STATIC_DIR": "/nonexistent/dir"})
    assert listen_address({}) == ("127.0.0.1", 8080)
    assert listen_address({"NIUNIU_BIND_HOST": "0.0.0.0", "NIUNIU_GATEWAY_PORT": "9000"}) == ("0.0.0.0", 9000)


def test_only_player_calls_are_exposed() -> None:
    paths = set(exposed())
    assert (
        "/niuniu.table.v1.Table/WatchTable" in paths and exposed()["/niuniu.table.v1.Table/WatchTable"].server_streaming
    )
    assert "/niuniu.wallet.v1.Wallet/Login" in paths
    staff = {"CreateTable", "UpdateConfig", "CloseTable", "Deposit", "Withdraw", "PlaceHold", "PlaceHolds", "PostHold"}
    staff |= {"VoidHold", "ResizeHold", "GetHolds", "ListBalances", "GetRoundSettlement"}
    assert not {p.rsplit("/", 1)[1] for p in paths} & staff


async def test_an_unreachable_service_is_unavailable_without_its_address() -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from services.gateway.app import Gateway

    channels = {"table": grpc.aio.insecure_channel("127.0.0.1:1"), "wallet": grpc.aio.insecure_channel("127.0.0.1:1")}
    app: web.Application = Gateway(channels).application()
    async with TestClient(TestServer(app)) as client:
        answer = await client.post(
            "/niuniu.table.v1.Table/ListTables", data=b"{}", headers={"Content-Type": "application/json"}
        )
        body = await answer.json()
    for channel in channels.values():
        await channel.close()
    assert answer.status == 503 and body["code"] == "unavailable"
    assert body["message"] == "SERVICE_UNAVAILABLE: the table service cannot be reached"
