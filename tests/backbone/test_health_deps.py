"""Health tells the truth: a real wallet process whose PostgreSQL, Redis and Kafka links run through
fault proxies turns NOT_SERVING when one is cut, answers requests UNAVAILABLE during a database
outage, and serves again (the same request now applied once) when the link is restored.

The shared PostgreSQL, Redis and Kafka keep running: only this process's links to them are cut.
The Kafka proxy carries the bootstrap address only (the broker advertises its own address to the
clients), so the Kafka case shows the probe and health reacting to a broker that stops answering,
not the clients' own reconnection.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import grpc
import psycopg
import psycopg.errors
import pytest
from niuniu.wallet.v1 import wallet_pb2
from psycopg import sql

from backbone.config import ConfigError, DbTimeouts, Settings
from backbone.db import connect, open_pool
from backbone.errors import REASON_METADATA_KEY, dependency_failure
from backbone.healthcheck import check
from tools.chaos.proxy import FaultProxy

E2E = Path(__file__).resolve().parents[1] / "e2e"
if str(E2E) not in sys.path:
    sys.path.insert(0, str(E2E))  # the end-to-end stack and its clients, imported by their bare names

from players import Clients, clients, register  # noqa: E402  (tests/e2e on the path)
from stack import ROOT, Stack  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FLIP_DEADLINE_S = 15.0
"""Generous bound for the test to give up; the figure printed is what it took."""
RPC_DEADLINE_S = 20.0
HEALTH_CHECK_S = 2.0
"""Each health check must answer within this (the issue: checks timed out while Kafka was down)."""


def _through(url: str, proxy: FaultProxy) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{proxy.address}" if userinfo else proxy.address
    return urlunsplit(parts._replace(netloc=netloc))


def _proxy_for(host_port: str) -> FaultProxy:
    host, _, port = host_port.rpartition(":")
    proxy = FaultProxy(host.strip("[]"), int(port))
    proxy.start()
    return proxy


@dataclass
class Proxied:
    stack: Stack
    postgres: FaultProxy
    redis: FaultProxy
    kafka: FaultProxy

    @property
    def addr(self) -> str:
        return self.stack.addr("wallet")


@pytest.fixture(scope="module")
def proxied(infra: dict[str, str]) -> Iterator[Proxied]:
    pg_url, redis_url = urlsplit(infra["DATABASE_URL"]), urlsplit(infra["REDIS_URL"])
    postgres = _proxy_for(f"{pg_url.hostname}:{pg_url.port or 5432}")
    redis = _proxy_for(f"{redis_url.hostname}:{redis_url.port or 6379}")
    kafka = _proxy_for(infra["KAFKA_BOOTSTRAP_SERVERS"].split(",")[0])
    run_id = uuid.uuid4().hex[:8]
    through = {
        "DATABASE_URL": _through(infra["DATABASE_URL"], postgres),
        "REDIS_URL": _through(infra["REDIS_URL"], redis),
        "KAFKA_BOOTSTRAP_SERVERS": kafka.address,
    }
    stack = Stack(run_id, {**infra, **through}, ROOT / ".run" / "e2e" / f"health-{run_id}")
    try:
        stack.start("wallet")
        yield Proxied(stack, postgres, redis, kafka)
    finally:
        stack.stop_all()
        for proxy in (postgres, redis, kafka):
            proxy.close()


def _wait_health(addr: str, wanted: str) -> float:
    """Seconds until ``addr`` reports ``wanted``; every check along the way must answer promptly."""
    started = time.monotonic()
    while time.monotonic() - started < FLIP_DEADLINE_S:
        status = check(addr, timeout_s=HEALTH_CHECK_S)
        assert status in ("SERVING", "NOT_SERVING"), f"health check did not answer: {status}"
        if status == wanted:
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"health never became {wanted} within {FLIP_DEADLINE_S} s")


def _reason(error: grpc.aio.AioRpcError) -> str | None:
    return dict(error.trailing_metadata() or ()).get(REASON_METADATA_KEY)


async def _wallet(addr: str) -> tuple[grpc.aio.Channel, Clients]:
    channel = grpc.aio.insecure_channel(addr)
    return channel, clients(channel, channel, channel)


async def test_a_database_outage_is_not_serving_and_unavailable_then_serves_again(proxied: Proxied) -> None:
    assert check(proxied.addr) == "SERVING"
    channel, c = await _wallet(proxied.addr)
    async with channel:
        player = await register(c, f"hd{uuid.uuid4().hex[:8]}", 0)
        deposit = wallet_pb2.DepositRequest(request_id=f"dep-{player.name}", account=player.account, amount_minor=700)

        proxied.postgres.cut()
        flipped_s = _wait_health(proxied.addr, "NOT_SERVING")
        print(f"\nPostgreSQL cut: NOT_SERVING after {flipped_s:.2f} s")

        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await c.wallet.Deposit(deposit, metadata=c.admin, timeout=RPC_DEADLINE_S)
        print(f"deposit during the outage: {refused.value.code().name} after {time.monotonic() - started:.2f} s")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
        assert _reason(refused.value) == "DATABASE_UNAVAILABLE"

        proxied.postgres.restore()
        back_s = _wait_health(proxied.addr, "SERVING")
        print(f"PostgreSQL restored: SERVING after {back_s:.2f} s")

        # The same request (same id) now goes through, once; a repeat changes nothing.
        await c.wallet.Deposit(deposit, metadata=c.admin, timeout=RPC_DEADLINE_S)
        await c.wallet.Deposit(deposit, metadata=c.admin, timeout=RPC_DEADLINE_S)
        balance = await c.wallet.GetBalance(wallet_pb2.GetBalanceRequest(), metadata=player.auth, timeout=5)
        assert balance.available_minor == 700


@pytest.mark.parametrize("dependency", ["redis", "kafka"])
def test_a_silent_dependency_turns_health_not_serving_and_back(proxied: Proxied, dependency: str) -> None:
    """A blackholed link (connections accepted, never answered): the probe's own timeout notices."""
    proxy: FaultProxy = getattr(proxied, dependency)
    assert _wait_health(proxied.addr, "SERVING") >= 0
    proxy.cut(blackhole=True)
    try:
        flipped_s = _wait_health(proxied.addr, "NOT_SERVING")
        print(f"\n{dependency} silent: NOT_SERVING after {flipped_s:.2f} s")
    finally:
        proxy.restore()
    back_s = _wait_health(proxied.addr, "SERVING")
    print(f"{dependency} restored: SERVING after {back_s:.2f} s")


SHORT = DbTimeouts(connect_timeout_s=2, statement_timeout_ms=400, lock_timeout_ms=300, pool_timeout_s=1)
BOUNDS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


async def test_pooled_connections_carry_the_bounds(dsn: str, schema: str) -> None:
    pool = await open_pool(dsn, min_size=1, max_size=2, schema=schema, timeouts=SHORT)
    try:
        async with pool.connection() as conn:
            shown = [(await (await conn.execute(f"SHOW {name}")).fetchone() or ("",))[0] for name in BOUNDS]
        assert shown == ["400ms", "300ms", "1min"]
    finally:
        await pool.close()


async def test_a_lock_wait_and_a_long_statement_give_up_and_map_to_unavailable(dsn: str, schema: str) -> None:
    table = sql.Identifier(schema, "bounded")
    async with await connect(dsn, autocommit=True, timeouts=SHORT) as holder:
        await holder.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(table))
        await holder.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(table))
        pool = await open_pool(dsn, min_size=1, max_size=2, timeouts=SHORT)
        try:
            async with holder.transaction():
                await holder.execute(sql.SQL("SELECT * FROM {} WHERE id = 1 FOR UPDATE").format(table))
                with pytest.raises(psycopg.errors.LockNotAvailable) as locked:
                    async with pool.connection() as conn:
                        await conn.execute(sql.SQL("SELECT * FROM {} WHERE id = 1 FOR UPDATE").format(table))
            with pytest.raises(psycopg.errors.QueryCanceled) as slow:
                async with pool.connection() as conn:
                    await conn.execute("SELECT pg_sleep(5)")
        finally:
            await pool.close()
    assert (mapped := dependency_failure(locked.value)) is not None and mapped.reason == "DATABASE_LOCK_TIMEOUT"
    assert (mapped := dependency_failure(slow.value)) is not None and mapped.reason == "DATABASE_TIMEOUT"


async def test_a_pool_wait_is_bounded_and_unavailable(dsn: str) -> None:
    pool = await open_pool(dsn, min_size=1, max_size=1, timeouts=SHORT)
    try:
        async with pool.connection():
            with pytest.raises(psycopg.OperationalError) as exhausted:  # PoolTimeout after pool_timeout_s
                async with asyncio.timeout(10), pool.connection():
                    pass
    finally:
        await pool.close()
    assert (mapped := dependency_failure(exhausted.value)) is not None and mapped.reason == "DATABASE_UNAVAILABLE"


def test_the_bounds_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIUNIU_DB_LOCK_TIMEOUT_MS", "1234")
    monkeypatch.setenv("NIUNIU_HEALTH_PROBE_INTERVAL_MS", "250")
    settings = Settings.from_env("wallet", grpc_port=0, metrics_port=0)
    assert settings.db_timeouts.lock_timeout_ms == 1234
    assert settings.db_timeouts.statement_timeout_ms == DbTimeouts().statement_timeout_ms
    assert settings.health.probe_interval_ms == 250
    for bad in ("0", "-5", "soon"):
        monkeypatch.setenv("NIUNIU_DB_STATEMENT_TIMEOUT_MS", bad)
        with pytest.raises(ConfigError, match="NIUNIU_DB_STATEMENT_TIMEOUT_MS"):
            Settings.from_env("wallet", grpc_port=0, metrics_port=0)
