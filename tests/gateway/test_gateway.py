"""The browser gateway on the real system: gRPC-web and Connect calls from an HTTP/1.1 client.

Four service processes (real Kafka, PostgreSQL, Redis) with ``niuniu-gateway`` in front; every
call here goes over plain HTTP/1.1 as a browser's fetch would send it: registration, login and
balance through gRPC-web (binary and text), Connect unary (JSON and binary), a live
``WatchTable`` through both protocols while a bet placed through the gateway shows up in it,
the CORS preflight, staff calls refused, and malformed or oversized requests answered with a
precise status that changes nothing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import aiohttp
import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2
from play import connect, kind
from players import register
from prometheus_client.parser import text_string_to_metric_families
from stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

M = TypeVar("M", bound=Message)
TABLE = "/niuniu.table.v1.Table/"
WALLET = "/niuniu.wallet.v1.Wallet/"
FAST = ev.TableLimits(
    min_bet_minor=100, max_bet_minor=5_000, chips_minor=[100], betting_seconds=2, reveal_interval_ms=10,
    pause_between_rounds_ms=200,
)  # fmt: skip
STREAM_WAIT_S = 60.0


def frame(payload: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(payload)) + payload


def frames(body: bytes) -> list[tuple[int, bytes]]:
    out, position = [], 0
    while position + 5 <= len(body):
        flag, length = struct.unpack_from(">BI", body, position)
        out.append((flag, body[position + 5 : position + 5 + length]))
        position += 5 + length
    assert position == len(body), "a frame was cut off"
    return out


def decode_text(body: bytes) -> bytes:
    # Each flushed chunk is padded base64 on its own (grpc-web-text).
    out, position = b"", 0
    while position < len(body):
        end = position + 4
        while end <= len(body) and not body[position:end].endswith(b"=") and end < len(body):
            end += 4
        out += base64.b64decode(body[position:end])
        position = end
    return out


def trailers_of(payload: bytes) -> dict[str, str]:
    lines = [line for line in payload.decode().split("\r\n") if line]
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}


async def grpc_web(
    session: aiohttp.ClientSession,
    base: str,
    path: str,
    request: Message | bytes,
    reply: type[M],
    *,
    token: str = "",
    text: bool = False,
    headers: dict[str, str] | None = None,
) -> tuple[list[M], dict[str, str]]:
    body = frame(request if isinstance(request, bytes) else request.SerializeToString())
    sent = {
        "Content-Type": "application/grpc-web-text" if text else "application/grpc-web+proto",
        "X-Grpc-Web": "1",
        **({"Authorization": f"Bearer {token}"} if token else {}),
        **(headers or {}),
    }
    async with session.post(base + path, data=base64.b64encode(body) if text else body, headers=sent) as answer:
        assert answer.status == 200, await answer.text()
        raw = await answer.read()
    messages, trailers = [], {}
    for flag, payload in frames(decode_text(raw) if text else raw):
        if flag & 0x80:
            trailers = trailers_of(payload)
        else:
            messages.append(reply.FromString(payload))
    assert "grpc-status" in trailers, f"no trailers frame: {raw!r}"
    return messages, trailers


async def connect_json(
    session: aiohttp.ClientSession, base: str, path: str, request: dict[str, Any], token: str = ""
) -> tuple[int, dict[str, Any]]:
    sent = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    async with session.post(base + path, data=json.dumps(request), headers=sent) as answer:
        return answer.status, await answer.json(content_type=None)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        yield s


async def test_register_login_and_balance_over_grpc_web(
    stack: Stack, gateway: str, session: aiohttp.ClientSession
) -> None:
    name = f"web{stack.run_id}"
    register_request = wallet_pb2.RegisterRequest(
        request_id=f"reg-{name}", username=name, email=f"{name}@example.org", password="correct-horse-9"
    )
    registered, trailers = await grpc_web(
        session, gateway, WALLET + "Register", register_request, wallet_pb2.RegisterResponse
    )
    assert trailers["grpc-status"] == "0", trailers
    account = registered[0].account
    login = wallet_pb2.LoginRequest(username=name, password="correct-horse-9")
    logged, trailers = await grpc_web(session, gateway, WALLET + "Login", login, wallet_pb2.LoginResponse, text=True)
    assert trailers["grpc-status"] == "0" and logged[0].account == account and logged[0].token
    async with connect(stack) as c:  # funding is a staff call: straight to the wallet, never through the gateway
        await c.wallet.Deposit(
            wallet_pb2.DepositRequest(request_id=f"dep-{name}", account=account, amount_minor=12_345), metadata=c.admin
        )
    balance_request = wallet_pb2.GetBalanceRequest(account=account)
    balances, trailers = await grpc_web(
        session, gateway, WALLET + "GetBalance", balance_request, wallet_pb2.AccountBalance, token=logged[0].token
    )
    assert trailers["grpc-status"] == "0" and balances[0].available_minor == 12_345
    # No token: the wallet's own refusal comes through as grpc-web trailers.
    _, trailers = await grpc_web(session, gateway, WALLET + "GetBalance", balance_request, wallet_pb2.AccountBalance)
    assert trailers["grpc-status"] == str(grpc.StatusCode.UNAUTHENTICATED.value[0]), trailers
    wrong = wallet_pb2.LoginRequest(username=name, password="wrong-password-1")
    _, trailers = await grpc_web(session, gateway, WALLET + "Login", wrong, wallet_pb2.LoginResponse, text=True)
    assert trailers["grpc-status"] == "16" and "INVALID_CREDENTIALS" in trailers["grpc-message"], trailers


async def test_connect_unary_json_and_binary(stack: Stack, gateway: str, session: aiohttp.ClientSession) -> None:
    async with connect(stack) as c:
        player = await register(c, f"cj{stack.run_id}", 5_000)
    password = f"cj{stack.run_id}-secret-pw"
    status, body = await connect_json(
        session, gateway, WALLET + "Login", {"username": player.name, "password": password}
    )
    assert status == 200 and body["account"] == player.account and body["token"], body
    status, body = await connect_json(
        session, gateway, WALLET + "GetBalance", {"account": player.account}, body["token"]
    )
    assert status == 200 and body["availableMinor"] == "5000", body  # int64 as a string (protobuf JSON)
    status, body = await connect_json(
        session, gateway, WALLET + "Login", {"username": player.name, "password": "nope-nope"}
    )
    assert status == 401 and body["code"] == "unauthenticated" and "INVALID_CREDENTIALS" in body["message"], body
    # Binary Connect: a bare message body, application/proto both ways.
    headers = {"Content-Type": "application/proto", "Authorization": f"Bearer {player.token}"}
    request = wallet_pb2.GetProfileRequest().SerializeToString()
    async with session.post(gateway + WALLET + "GetProfile", data=request, headers=headers) as answer:
        assert answer.status == 200 and answer.content_type == "application/proto"
        profile = wallet_pb2.Profile.FromString(await answer.read())
    assert profile.account == player.account


async def read_grpc_web_stream(
    answer: aiohttp.ClientResponse, text: bool, until: Callable[[list[table_pb2.TableUpdate]], bool]
) -> list[table_pb2.TableUpdate]:
    raw, updates = b"", list[table_pb2.TableUpdate]()
    async for chunk in answer.content.iter_any():
        raw += chunk
        data = decode_text(raw[: len(raw) - len(raw) % 4]) if text else raw
        updates = []
        position = 0
        while position + 5 <= len(data):
            flag, length = struct.unpack_from(">BI", data, position)
            if position + 5 + length > len(data):
                break
            assert not flag & 0x80, f"stream ended: {trailers_of(data[position + 5 : position + 5 + length])}"
            updates.append(table_pb2.TableUpdate.FromString(data[position + 5 : position + 5 + length]))
            position += 5 + length
        if until(updates):
            return updates
    raise AssertionError("the stream ended early")


async def read_connect_stream(
    answer: aiohttp.ClientResponse, until: Callable[[list[table_pb2.TableUpdate]], bool]
) -> list[table_pb2.TableUpdate]:
    raw, updates = b"", list[table_pb2.TableUpdate]()
    async for chunk in answer.content.iter_any():
        raw += chunk
        updates, position = [], 0
        while position + 5 <= len(raw):
            flag, length = struct.unpack_from(">BI", raw, position)
            if position + 5 + length > len(raw):
                break
            payload = raw[position + 5 : position + 5 + length]
            assert not flag & 0x02, f"stream ended: {payload!r}"
            updates.append(json_format.Parse(payload, table_pb2.TableUpdate(), ignore_unknown_fields=True))
            position += 5 + length
        if until(updates):
            return updates
    raise AssertionError("the stream ended early")


async def test_watch_table_streams_a_bet_placed_through_the_gateway(
    stack: Stack, gateway: str, session: aiohttp.ClientSession, allowed_origin: str
) -> None:
    table_id = f"web-{stack.run_id}"
    async with connect(stack) as c:
        player = await register(c, f"wt{stack.run_id}", 100_000)
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=FAST), metadata=c.admin
        )
    auth = {"Authorization": f"Bearer {player.token}"}
    watch = table_pb2.WatchTableRequest(table_id=table_id)
    web_headers = {"Content-Type": "application/grpc-web-text", "X-Grpc-Web": "1", "Origin": allowed_origin, **auth}
    connect_headers = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1", **auth}
    body_json = json.dumps(json_format.MessageToDict(watch)).encode()

    def balanced(us: list[table_pb2.TableUpdate]) -> bool:  # up to the balance after the round with the bet
        return any(kind(u) == "my_bet_placed" for u in us) and any(kind(u) == "balance" for u in us)

    async with (
        session.post(gateway + TABLE + "WatchTable", data=base64.b64encode(frame(watch.SerializeToString())),
                     headers=web_headers) as web_answer,
        session.post(gateway + TABLE + "WatchTable", data=frame(body_json), headers=connect_headers) as connect_answer,
    ):  # fmt: skip
        assert web_answer.status == 200 and web_answer.headers["Access-Control-Allow-Origin"] == allowed_origin
        assert connect_answer.content_type == "application/connect+json"
        web_reader = asyncio.create_task(read_grpc_web_stream(web_answer, True, balanced))
        connect_reader = asyncio.create_task(read_connect_stream(connect_answer, balanced))
        round_id = await open_round(session, gateway, table_id, player.token)
        bet = table_pb2.PlaceBetRequest(
            command_id=f"web-bet-{stack.run_id}", table_id=table_id, area="area_1", amount_minor=100, round_id=round_id
        )
        receipts, trailers = await grpc_web(
            session, gateway, TABLE + "PlaceBet", bet, table_pb2.BetReceipt, token=player.token
        )
        assert trailers["grpc-status"] == "0" and receipts[0].status == "placed", trailers
        for reader in (web_reader, connect_reader):
            updates = await asyncio.wait_for(reader, STREAM_WAIT_S)
            mine = [u for u in updates if kind(u) == "my_bet_placed"]
            assert [u.my_bet_placed.stake_minor for u in mine] == [100]
            assert mine[0].round_id == round_id
            kinds = [(kind(u), u.round_id) for u in updates]
            result = kinds.index(("result", round_id))
            assert kinds[result + 1] == ("balance", round_id)  # the balance right after the result
            balance = updates[result + 1].balance
            assert balance.settlement_status == "settled" and balance.account == player.account
            assert balance.net_minor == updates[result].result.my_net_minor
            async with connect(stack) as c:  # the wallet had applied it: its balance is the one announced
                wallet = await c.wallet.GetBalance(
                    wallet_pb2.GetBalanceRequest(account=player.account), metadata=c.admin
                )
            assert balance.available_minor == wallet.available_minor == 100_000 + balance.net_minor
            positions = [u.position for u in updates if kind(u) != "heartbeat"]
            assert positions == sorted(set(positions)) and all(u.server_time_unix_ms > 0 for u in updates)
        # A client dropped after any update resumes with exactly the rest (Connect, through the gateway).
        seen = [u for u in await connect_reader if kind(u) != "heartbeat"]
        for i, update in enumerate(seen[:-1]):
            rest = seen[i + 1 :]
            resume = json.dumps({"tableId": table_id, "afterPosition": str(update.position)}).encode()
            async with session.post(
                gateway + TABLE + "WatchTable", data=frame(resume), headers=connect_headers
            ) as again:
                got = await read_connect_stream(again, at_least(len(rest)))
            got = [u for u in got if kind(u) != "heartbeat"][: len(rest)]
            assert same_updates(got, rest), f"resume after #{i} ({kind(update)}) differs"


def at_least(n: int) -> Callable[[list[table_pb2.TableUpdate]], bool]:
    return lambda us: len([u for u in us if kind(u) != "heartbeat"]) >= n


def same_updates(a: list[table_pb2.TableUpdate], b: list[table_pb2.TableUpdate]) -> bool:
    def bare(u: table_pb2.TableUpdate) -> bytes:
        copy = table_pb2.TableUpdate()
        copy.CopyFrom(u)
        copy.ClearField("server_time_unix_ms")
        if copy.WhichOneof("update") == "balance":  # the balance now (unchanged here: no later bet)
            copy.balance.ClearField("available_minor")
        return copy.SerializeToString(deterministic=True)

    return [bare(u) for u in a] == [bare(u) for u in b]


async def open_round(session: aiohttp.ClientSession, gateway: str, table_id: str, token: str) -> str:
    """The id of a round open for bets, read through the gateway (Connect JSON GetTable)."""
    for _ in range(600):
        status, info = await connect_json(session, gateway, TABLE + "GetTable", {"tableId": table_id}, token)
        assert status == 200, info
        if info.get("phase") == "betting" and int(info.get("bettingClosesAtUnixMs", "0")) > 0:
            return str(info["currentRoundId"])
        await asyncio.sleep(0.1)
    raise AssertionError("no betting round within a minute")


async def test_cors_preflight_and_origins(gateway: str, session: aiohttp.ClientSession, allowed_origin: str) -> None:
    preflight = {
        "Origin": allowed_origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,x-grpc-web,x-user-agent",
    }
    async with session.options(gateway + WALLET + "Login", headers=preflight) as answer:
        assert answer.status == 204
        assert answer.headers["Access-Control-Allow-Origin"] == allowed_origin
        allowed = {h.strip() for h in answer.headers["Access-Control-Allow-Headers"].split(",")}
        assert {"authorization", "content-type", "x-grpc-web", "x-user-agent", "connect-protocol-version"} <= allowed
        assert "POST" in answer.headers["Access-Control-Allow-Methods"]
    async with session.options(
        gateway + WALLET + "Login", headers={**preflight, "Origin": "http://evil.test"}
    ) as answer:
        assert answer.status == 403 and "Access-Control-Allow-Origin" not in answer.headers
    # A page on another origin cannot call at all (not only not read): refused before forwarding.
    login = frame(wallet_pb2.LoginRequest(username="nobody", password="whatever-1").SerializeToString())
    headers = {"Content-Type": "application/grpc-web+proto", "Origin": "http://evil.test"}
    async with session.post(gateway + WALLET + "Login", data=login, headers=headers) as answer:
        assert answer.status == 403
    async with session.post(
        gateway + WALLET + "Login", data=login, headers={**headers, "Origin": allowed_origin}
    ) as answer:
        assert answer.status == 200
        exposed = answer.headers["Access-Control-Expose-Headers"]
        assert "grpc-status" in exposed and "grpc-message" in exposed


async def test_staff_calls_are_not_served(stack: Stack, gateway: str, session: aiohttp.ClientSession) -> None:
    async with connect(stack) as c:
        admin_token = c.admin[0][1].removeprefix("Bearer ")
        create = table_pb2.CreateTableRequest(table_id=f"adm-{stack.run_id}", variant="golden_bull")
        _, trailers = await grpc_web(
            session, gateway, TABLE + "CreateTable", create, table_pb2.TableInfo, token=admin_token
        )
        assert trailers["grpc-status"] == "12" and "METHOD_NOT_EXPOSED" in trailers["grpc-message"], trailers
        deposit = {"requestId": "x", "account": "player:x", "amountMinor": "100"}
        status, body = await connect_json(session, gateway, WALLET + "Deposit", deposit, admin_token)
        assert status == 501 and body["code"] == "unimplemented", body
        with pytest.raises(grpc.aio.AioRpcError) as missing:  # nothing was created behind the refusal
            await c.table.GetTable(table_pb2.GetTableRequest(table_id=f"adm-{stack.run_id}"), metadata=c.admin)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    async with session.post(gateway + "/grpc.health.v1.Health/Check", data=frame(b""),
                            headers={"Content-Type": "application/grpc-web+proto"}) as answer:  # fmt: skip
        assert trailers_of(frames(await answer.read())[-1][1])["grpc-status"] == "12"


@pytest.mark.parametrize(
    ("body", "code", "reason"),
    [
        (frame(b"\x0a\x05ab"), 3, "MALFORMED_MESSAGE"),  # a field announcing 5 bytes, holding 2
        (frame(b"ab")[:-1], 3, "MALFORMED_FRAME"),  # the frame announces more than the body holds
        (b"\x00\x00", 3, "MALFORMED_FRAME"),
        (frame(b"", flag=0x01), 12, "COMPRESSION_NOT_SUPPORTED"),
        (frame(b"") + frame(b""), 3, "MALFORMED_FRAME"),  # a unary call takes one message
    ],
)
async def test_bad_grpc_web_bodies_get_a_precise_status(
    gateway: str, session: aiohttp.ClientSession, body: bytes, code: int, reason: str
) -> None:
    headers = {"Content-Type": "application/grpc-web+proto"}
    async with session.post(gateway + WALLET + "Login", data=body, headers=headers) as answer:
        assert answer.status == 200
        parts = frames(await answer.read())
    trailers = trailers_of(parts[-1][1])
    assert trailers["grpc-status"] == str(code) and reason in trailers["grpc-message"], trailers


async def test_bad_connect_and_http_requests(gateway: str, session: aiohttp.ClientSession) -> None:
    headers = {"Content-Type": "application/json"}
    async with session.post(gateway + WALLET + "Login", data=b"{not json", headers=headers) as answer:
        body = await answer.json(content_type=None)
        assert answer.status == 400 and body["code"] == "invalid_argument" and "MALFORMED_MESSAGE" in body["message"]
    async with session.post(gateway + WALLET + "Login", data=b'{"username": 5}', headers=headers) as answer:
        assert answer.status == 400 and (await answer.json(content_type=None))["code"] == "invalid_argument"
    # A unary content type for the streaming call (Connect streams are enveloped).
    async with session.post(gateway + TABLE + "WatchTable", data=b"{}", headers=headers) as answer:
        body = await answer.json(content_type=None)
        assert answer.status == 400 and "WRONG_CONTENT_TYPE" in body["message"], body
    async with session.post(gateway + WALLET + "Login", data=b"x", headers={"Content-Type": "text/plain"}) as answer:
        assert answer.status == 415
    async with session.post(
        gateway + WALLET + "Login", data=b"!!!!", headers={"Content-Type": "application/grpc-web-text"}
    ) as answer:
        raw = base64.b64decode(await answer.read())
        assert "MALFORMED_BODY" in trailers_of(frames(raw)[-1][1])["grpc-message"]
    async with session.get(gateway + "/healthz") as answer:
        assert answer.status == 200


async def test_limits_on_body_size_and_concurrent_streams(
    stack: Stack, tight_gateway: str, session: aiohttp.ClientSession
) -> None:
    big = wallet_pb2.LoginRequest(username="u" * 300, password="p" * 8)
    _, trailers = await grpc_web(session, tight_gateway, WALLET + "Login", big, wallet_pb2.LoginResponse)
    assert trailers["grpc-status"] == "8" and "REQUEST_TOO_LARGE" in trailers["grpc-message"], trailers
    table_id = f"lim-{stack.run_id}"
    async with connect(stack) as c:
        player = await register(c, f"lm{stack.run_id}", 0)
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=FAST), metadata=c.admin
        )
    watch = frame(table_pb2.WatchTableRequest(table_id=table_id).SerializeToString())
    headers = {"Content-Type": "application/grpc-web+proto", "Authorization": f"Bearer {player.token}"}
    async with session.post(tight_gateway + TABLE + "WatchTable", data=watch, headers=headers) as first:
        await read_grpc_web_stream(first, False, lambda us: len(us) > 0)  # the first stream is live
        async with session.post(tight_gateway + TABLE + "WatchTable", data=watch, headers=headers) as second:
            trailers = trailers_of(frames(await second.read())[-1][1])
        assert trailers["grpc-status"] == "8" and "TOO_MANY_STREAMS" in trailers["grpc-message"], trailers
    # The first stream's slot is given back when its caller goes away.
    for _ in range(50):
        async with session.post(tight_gateway + TABLE + "WatchTable", data=watch, headers=headers) as third:
            chunk = await third.content.read(5)
            flag = chunk[0] if chunk else 0x80
            if not flag & 0x80:
                return
        await asyncio.sleep(0.1)
    raise AssertionError("the stream slot was never released")


async def open_stream(session: aiohttp.ClientSession, base: str, table_id: str, token: str) -> aiohttp.ClientResponse:
    """A WatchTable through gRPC-web: live once it has shown one update, else its end's trailers raise."""
    watch = frame(table_pb2.WatchTableRequest(table_id=table_id).SerializeToString())
    headers = {"Content-Type": "application/grpc-web+proto", "Authorization": f"Bearer {token}"}
    answer = await session.post(base + TABLE + "WatchTable", data=watch, headers=headers)
    assert answer.status == 200
    return answer


async def refusal(answer: aiohttp.ClientResponse) -> str:
    async with answer:
        trailers = trailers_of(frames(await answer.read())[-1][1])
    assert trailers["grpc-status"] == "8", trailers  # RESOURCE_EXHAUSTED
    return trailers["grpc-message"].partition(":")[0]


async def test_one_caller_or_one_address_cannot_take_every_stream(
    stack: Stack, capped_gateway: str, session: aiohttp.ClientSession
) -> None:
    """One stream per caller and two per address (every test client shares 127.0.0.1): a caller's
    second stream and the address's third are refused with their own reason, and a closed stream's
    slot serves the next caller."""
    table_id = f"cap-{stack.run_id}"
    async with connect(stack) as c:
        alice, bob, carol = [await register(c, f"{n}{stack.run_id}", 0) for n in ("ca", "cb", "cc")]
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=FAST), metadata=c.admin
        )
    first = await open_stream(session, capped_gateway, table_id, alice.token)
    await read_grpc_web_stream(first, False, lambda us: len(us) > 0)
    assert await refusal(await open_stream(session, capped_gateway, table_id, alice.token)) == (
        "TOO_MANY_STREAMS_PER_CALLER"
    )
    second = await open_stream(session, capped_gateway, table_id, bob.token)
    await read_grpc_web_stream(second, False, lambda us: len(us) > 0)
    assert await refusal(await open_stream(session, capped_gateway, table_id, carol.token)) == (
        "TOO_MANY_STREAMS_PER_ADDRESS"
    )
    first.close()
    for _ in range(50):  # alice's slot comes back once the gateway sees her go
        third = await open_stream(session, capped_gateway, table_id, carol.token)
        async with third:
            chunk = await third.content.read(5)
            if chunk and not chunk[0] & 0x80:
                second.close()
                return
        await asyncio.sleep(0.1)
    raise AssertionError("the closed stream's slot was never released")


async def test_an_overflowed_amount_is_refused_by_the_gateway_and_by_the_table(
    stack: Stack, gateway: str, session: aiohttp.ClientSession
) -> None:
    """A bet of 2^64 + 100 would be read as 100: refused INVALID_ARGUMENT through gRPC-web and when sent
    to the table over gRPC directly, and nothing is held."""
    table_id = f"ovf-{stack.run_id}"
    async with connect(stack) as c:
        player = await register(c, f"ov{stack.run_id}", 10_000)
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=FAST), metadata=c.admin
        )
        round_id = await open_round(session, gateway, table_id, player.token)
        bet = table_pb2.PlaceBetRequest(command_id=f"ovf-{stack.run_id}", table_id=table_id, area="area_1",
                                        round_id=round_id)  # fmt: skip
        number = bet.DESCRIPTOR.fields_by_name["amount_minor"].number
        raw = bet.SerializeToString() + bytes([number << 3]) + b"\xe4" + b"\x80" * 8 + b"\x02"  # 2^64 + 100
        assert table_pb2.PlaceBetRequest.FromString(raw).amount_minor == 100
        _, trailers = await grpc_web(session, gateway, TABLE + "PlaceBet", raw, table_pb2.BetReceipt,
                                     token=player.token)  # fmt: skip
        assert trailers["grpc-status"] == "3" and "INTEGER_OVERFLOW: amount_minor" in trailers["grpc-message"]
        async with grpc.aio.insecure_channel(stack.addr("table")) as channel:
            place: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(TABLE + "PlaceBet")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await place(raw, metadata=player.auth)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "INTEGER_OVERFLOW" in (refused.value.details() or "")
        balance = await c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(account=player.account), metadata=c.admin)
    assert (balance.available_minor, balance.held_minor) == (10_000, 0)


async def test_static_files_of_the_web_table(tight_gateway: str, session: aiohttp.ClientSession) -> None:
    async with session.get(tight_gateway + "/") as answer:
        assert answer.status == 200 and answer.content_type == "text/html"
        assert "<title>table</title>" in await answer.text()
    host = tight_gateway.removeprefix("http://")
    login = frame(wallet_pb2.LoginRequest(username="nobody", password="whatever-1").SerializeToString())
    for origin, status in ((f"http://{host}", 200), ("http://elsewhere.test", 403)):  # the page's own origin may call
        headers = {"Content-Type": "application/grpc-web+proto", "Origin": origin}
        async with session.post(tight_gateway + WALLET + "Login", data=login, headers=headers) as answer:
            assert answer.status == status, origin
    async with session.get(tight_gateway + "/app.js") as answer:
        assert answer.status == 200 and "javascript" in answer.content_type
    for path in ("/.env", "/missing.js", "/%2e%2e%2fpyproject.toml", "/..%2F..%2Fetc%2Fpasswd"):
        async with session.get(tight_gateway + path) as answer:
            assert answer.status == 404, path


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with session.get(url) as answer:
        assert answer.status == 200
        text = await answer.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_the_gateway_counts_what_it_answers_and_what_it_refuses(
    gateway: str, gateway_metrics: str, session: aiohttp.ClientSession, allowed_origin: str
) -> None:
    """Its own /metrics: calls by method, protocol and the code the caller got (the service's or the
    gateway's), unary durations, HTTP refusals, and the streams limit."""

    def calls(method: str, protocol: str, code: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return "niuniu_gateway_calls_total", (("code", code), ("method", method), ("protocol", protocol))

    def refused(reason: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return "niuniu_gateway_http_refused_total", (("reason", reason),)

    login_seconds = ("niuniu_gateway_call_duration_seconds_count", (("method", "Wallet/Login"),))
    counted = [
        calls("Wallet/Login", "grpc-web", "UNAUTHENTICATED"),
        calls("Wallet/Login", "grpc-web", "INVALID_ARGUMENT"),
        calls("Wallet/Login", "connect-unary", "INVALID_ARGUMENT"),
        calls("unexposed", "grpc-web", "UNIMPLEMENTED"),
        refused("origin"),
        refused("content_type"),
        login_seconds,
    ]
    before = await scrape(session, gateway_metrics)
    wrong = wallet_pb2.LoginRequest(username="nobody-here", password="wrong-password-1")
    _, trailers = await grpc_web(session, gateway, WALLET + "Login", wrong, wallet_pb2.LoginResponse)
    assert trailers["grpc-status"] == "16", trailers  # the wallet's answer
    grpc_web_headers = {"Content-Type": "application/grpc-web+proto"}
    async with session.post(gateway + WALLET + "Login", data=frame(b"\x0a\x05ab"), headers=grpc_web_headers) as a:
        assert trailers_of(frames(await a.read())[-1][1])["grpc-status"] == "3"  # the gateway's own
    async with session.post(gateway + WALLET + "Login", data=b"{x", headers={"Content-Type": "application/json"}) as a:
        assert a.status == 400
    async with session.post(gateway + "/grpc.health.v1.Health/Check", data=frame(b""), headers=grpc_web_headers) as a:
        assert trailers_of(frames(await a.read())[-1][1])["grpc-status"] == "12"
    headers = {**grpc_web_headers, "Origin": "http://evil.test"}
    async with session.post(gateway + WALLET + "Login", data=frame(b""), headers=headers) as a:
        assert a.status == 403
    async with session.post(gateway + WALLET + "Login", data=b"x", headers={"Content-Type": "text/plain"}) as a:
        assert a.status == 415
    after = await scrape(session, gateway_metrics)
    deltas = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in counted}
    assert deltas == dict.fromkeys(counted, 1.0)  # the duration: the forwarded call only
    assert after[("niuniu_gateway_streams_limit", ())] == 1000  # NIUNIU_GATEWAY_MAX_STREAMS' default
    assert after[("niuniu_gateway_streams_open", ())] >= 0
