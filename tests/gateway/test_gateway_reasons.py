"""The gateway's own refusals carry their reason code where the services' do, in each protocol.

A client reads ``niuniu-reason`` in one place whoever refused: as a response header of a
Connect unary error, in a Connect stream's end message metadata, in the gRPC-web trailers.
Each case puts a service's refusal (a wrong password, a watch without a token) next to one the
gateway answers itself (a call it does not serve, a body it cannot read).
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from niuniu.wallet.v1 import wallet_pb2

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WALLET = "/niuniu.wallet.v1.Wallet/"
TABLE = "/niuniu.table.v1.Table/"
CONNECT = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


def frames(body: bytes) -> list[tuple[int, bytes]]:
    out, position = [], 0
    while position + 5 <= len(body):
        flag, length = struct.unpack_from(">BI", body, position)
        out.append((flag, body[position + 5 : position + 5 + length]))
        position += 5 + length
    return out


async def connect_unary(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[str, str]:
    """(the error's code, the niuniu-reason header) of a Connect unary error."""
    async with session.post(url, data=json.dumps(body), headers=CONNECT) as answer:
        assert answer.status >= 400
        return (await answer.json(content_type=None))["code"], answer.headers.get("niuniu-reason", "")


async def connect_stream(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[str, list[str]]:
    """(the error's code, its metadata's niuniu-reason) from a Connect stream's end message."""
    headers = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
    async with session.post(url, data=struct.pack(">BI", 0, len(body)) + body, headers=headers) as answer:
        flag, end = frames(await answer.read())[-1]
    assert flag & 0x02, "the last message ends the stream"
    message = json.loads(end)
    return message["error"]["code"], message.get("metadata", {}).get("niuniu-reason", [])


async def grpc_web_trailers(session: aiohttp.ClientSession, url: str, payload: bytes) -> dict[str, str]:
    body = struct.pack(">BI", 0, len(payload)) + payload
    async with session.post(url, data=body, headers={"Content-Type": "application/grpc-web+proto"}) as answer:
        flag, trailers = frames(await answer.read())[-1]
    assert flag & 0x80
    lines = [line for line in trailers.decode().split("\r\n") if line]
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}


async def test_refusals_carry_niuniu_reason_in_the_same_place(gateway: str, session: aiohttp.ClientSession) -> None:
    wrong = {"username": "nobody-here", "password": "not-the-password"}
    service = await connect_unary(session, gateway + WALLET + "Login", wrong)
    own = await connect_unary(session, gateway + WALLET + "Deposit", {"requestId": "x"})
    assert service[0] == "unauthenticated" and service[1], service
    assert own == ("unimplemented", "METHOD_NOT_EXPOSED")

    service_stream = await connect_stream(session, gateway + TABLE + "WatchTable", b'{"tableId": "no-such-table"}')
    own_stream = await connect_stream(session, gateway + TABLE + "WatchTable", b'{"tableId": ')
    assert service_stream == ("unauthenticated", ["TOKEN_MISSING"]), service_stream
    assert own_stream == ("invalid_argument", ["MALFORMED_MESSAGE"])

    login = wallet_pb2.LoginRequest(**wrong).SerializeToString()
    service_trailers = await grpc_web_trailers(session, gateway + WALLET + "Login", login)
    own_trailers = await grpc_web_trailers(session, gateway + WALLET + "Withdraw", b"")
    assert service_trailers["grpc-status"] == "16" and service_trailers["niuniu-reason"] == service[1]
    assert own_trailers["grpc-status"] == "12" and own_trailers["niuniu-reason"] == "METHOD_NOT_EXPOSED"
