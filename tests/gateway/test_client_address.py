"""The wallet throttles log-ins by the real client address behind the gateway, and by nobody's say-so.

A wallet process with the default limits (30 failures from one address in 5 minutes) sits behind a
gateway that trusts the loopback as its proxy, so ``X-Forwarded-For`` names each test client. Wrong
passwords from one client lock that client out, not the next one behind the same gateway; an
address claimed in metadata by anyone but the gateway's identity counts for nothing.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import grpc
import pytest
from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc
from play import connect
from players import Player, register
from stack import BIN, ROOT, Stack, free_port, start_gateway, stop

from backbone.auth import Tokens, bearer
from backbone.clientaddress import CLIENT_ADDRESS_METADATA_KEY, GATEWAY_TOKEN_METADATA_KEY
from backbone.healthcheck import check
from backbone.tls import aio_channel

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOGIN = "/niuniu.wallet.v1.Wallet/Login"
ADDRESS_FAILURES = 30  # the wallet's default address_failures limit
GUESSER = "203.0.113.7"  # documentation addresses (RFC 5737): two clients behind the one gateway
NEIGHBOUR = "198.51.100.9"


@pytest.fixture(scope="module")
def strict_wallet(stack: Stack) -> Iterator[str]:
    """A second wallet process of the stack with the default throttle, at its own address."""
    port = free_port()
    env = stack.env("wallet")
    env.update(
        NIUNIU_WALLET_THROTTLE="", NIUNIU_WALLET_GRPC_PORT=str(port), NIUNIU_WALLET_METRICS_PORT=str(free_port())
    )
    log = (stack.log_dir / "wallet-strict.log").open("ab")
    proc = subprocess.Popen([str(BIN / "niuniu-wallet")], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    address = f"127.0.0.1:{port}"
    try:
        for _ in range(300):
            if proc.poll() is None and check(address) == "SERVING":
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"the strict wallet did not come up; see {stack.log_dir / 'wallet-strict.log'}")
        yield address
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def proxied_gateway(stack: Stack, strict_wallet: str) -> Iterator[str]:
    """A gateway in front of the strict wallet that takes the loopback for its proxy (an Ingress)."""
    proc, url = start_gateway(
        stack, "gateway-proxied", NIUNIU_WALLET_ADDR=strict_wallet, NIUNIU_GATEWAY_TRUSTED_PROXIES="127.0.0.1"
    )
    try:
        yield url
    finally:
        stop(proc)


@pytest.fixture
async def victim(stack: Stack) -> Player:
    async with connect(stack) as c:
        return await register(c, f"victim{uuid.uuid4().hex[:10]}", 0)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


async def login_from(
    session: aiohttp.ClientSession, gateway: str, client: str, username: str, password: str
) -> dict[str, Any]:
    """A Connect JSON Login sent by ``client`` through the proxy (the loopback) to the gateway."""
    headers = {"Content-Type": "application/json", "X-Forwarded-For": client}
    body = json.dumps({"username": username, "password": password})
    async with session.post(gateway + LOGIN, data=body, headers=headers) as answer:
        reply: dict[str, Any] = await answer.json(content_type=None)
        return reply


async def test_wrong_passwords_from_one_client_do_not_lock_out_the_next(
    stack: Stack, proxied_gateway: str, victim: Player, session: aiohttp.ClientSession
) -> None:
    codes = []
    for i in range(ADDRESS_FAILURES + 1):  # one account each: no account lock, only the address limit
        reply = await login_from(session, proxied_gateway, GUESSER, f"guess{i}-{stack.run_id}", "wrong-password-1")
        codes.append(reply.get("code"))
    assert codes == ["unauthenticated"] * ADDRESS_FAILURES + ["resource_exhausted"], codes
    password = f"{victim.name}-secret-pw"
    refused = await login_from(session, proxied_gateway, GUESSER, victim.name, password)
    assert refused.get("code") == "resource_exhausted", refused  # the guesser stays locked out, even when right
    admitted = await login_from(session, proxied_gateway, NEIGHBOUR, victim.name, password)
    assert admitted.get("account") == victim.account and admitted.get("token"), admitted


async def test_an_address_claimed_by_anyone_but_the_gateway_is_ignored(strict_wallet: str, victim: Player) -> None:
    password = f"{victim.name}-secret-pw"
    development = Tokens.development()
    not_the_gateway = [
        (),  # an address and no token
        ((GATEWAY_TOKEN_METADATA_KEY, bearer(development.service_token("table"))[0][1]),),  # another service
        ((GATEWAY_TOKEN_METADATA_KEY, bearer(Tokens.ephemeral().service_token("gateway"))[0][1]),),  # forged
        ((GATEWAY_TOKEN_METADATA_KEY, "Bearer not-a-token"),),
    ]
    gateway = ((GATEWAY_TOKEN_METADATA_KEY, bearer(development.service_token("gateway"))[0][1]),)
    async with aio_channel(strict_wallet, None) as channel:
        wallet = wallet_pb2_grpc.WalletStub(channel)
        for i in range(ADDRESS_FAILURES):  # each from a different claimed address: all count against the peer
            claim = ((CLIENT_ADDRESS_METADATA_KEY, f"192.0.2.{i + 1}"), *not_the_gateway[i % len(not_the_gateway)])
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await wallet.Login(wallet_pb2.LoginRequest(username=f"x{i}", password="wrong-1"), metadata=claim)
            assert failed.value.code() is grpc.StatusCode.UNAUTHENTICATED
        right = wallet_pb2.LoginRequest(username=victim.name, password=password)
        for extra in not_the_gateway:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await wallet.Login(right, metadata=((CLIENT_ADDRESS_METADATA_KEY, "192.0.2.200"), *extra))
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        # The same claim carried with the gateway's own token is the client's address.
        admitted = await wallet.Login(right, metadata=((CLIENT_ADDRESS_METADATA_KEY, "192.0.2.200"), *gateway))
        assert admitted.account == victim.account
