"""TLS on every link, end to end: ``NIUNIU_TLS=1 scripts/infra up`` on a scratch run directory.

A Kafka broker, a PostgreSQL cluster and a Redis server of the module's own (free ports, its own
local CA from ``scripts/keys generate --tls``) serve TLS; the four services reach them with
SASL_SSL, ``sslmode=verify-full`` and ``rediss://``, verifying each server's certificate, and
call each other with mutual TLS; the gateway serves HTTPS and calls the table and the wallet
with the operator's certificate. A Golden Bull round and a Bai Buu round (its bet placed through
the gateway) settle and the money reconciles. A gRPC client without a certificate, a plaintext
Kafka client at the TLS listener, a plaintext PostgreSQL connection and a plaintext Redis client
at the TLS port are all refused.

The shared infrastructure is not touched: the scratch set is stopped and purged at the end.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import psycopg
import pytest
import redis
from kafka.errors import KafkaTimeoutError
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc
from play import Watcher, connect, kind, ledger_matches_wallet, settle_everything, update_is
from players import Clients, Player, register
from stack import ROOT, Stack, free_port, running_stack, start_gateway, stop

from backbone.healthcheck import KafkaProbe
from backbone.kafka import default_principal_env, make_admin

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=5_000,
    chips_minor=[100],
    betting_seconds=2,
    reveal_interval_ms=10,
    pause_between_rounds_ms=50,
)
INFRA_TIMEOUT_S = 240


def read_env(path: Path) -> dict[str, str]:
    """The ``export K=V`` lines of an env file written by scripts/infra or scripts/keys."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line.removeprefix("export ").partition("=")
            out[key] = value
    return out


def infra_command(run_dir: Path, ports: dict[str, int], *args: str) -> subprocess.CompletedProcess[str]:
    """``scripts/infra`` on the module's run directory and ports, with TLS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIUNIU_", "KAFKA_", "REDIS_", "PG"))}
    env.update({f"NIUNIU_{name}": str(port) for name, port in ports.items()})
    env.update(
        NIUNIU_RUN_DIR=str(run_dir),
        NIUNIU_INFRA_LOCK=str(run_dir / "infra.lock"),
        NIUNIU_TLS="1",
        NIUNIU_KAFKA_HEAP="512m",
    )
    command = [str(ROOT / "scripts" / "infra"), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=INFRA_TIMEOUT_S, check=False)


@pytest.fixture(scope="module")
def tls_infra() -> Iterator[dict[str, str]]:
    """A scratch Kafka, PostgreSQL and Redis with TLS; the settings the services and the test use."""
    run_dir = ROOT / ".run" / "e2e" / f"tls-{uuid.uuid4().hex[:8]}"
    names = ("KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "KAFKA_TLS_PORT", "PG_PORT", "REDIS_PORT", "REDIS_TLS_PORT")
    ports = {name: free_port() for name in names}
    run_dir.mkdir(parents=True)
    started = infra_command(run_dir, ports, "up")
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        infra = default_principal_env(read_env(run_dir / "env"))  # the test principal may use e2e<id>. topics
        infra.update({k: v for k, v in read_env(run_dir / "keys" / "env").items() if "_TLS_" in k})
        yield infra
    finally:
        if infra_command(run_dir, ports, "down", "--purge").returncode == 0:
            shutil.rmtree(run_dir, ignore_errors=True)  # logs and keys too; kept when something failed to stop


@pytest.fixture(scope="module")
def tls_stack(tls_infra: dict[str, str]) -> Iterator[Stack]:
    """The four services on the TLS infrastructure; the test process holds the operator's certificate."""
    with pytest.MonkeyPatch.context() as patch:
        for key in ("NIUNIU_TLS_CA_FILE", "NIUNIU_TLS_CLIENT_CERT_FILE", "NIUNIU_TLS_CLIENT_KEY_FILE"):
            patch.setenv(key, tls_infra[key])
        with running_stack(tls_infra, uuid.uuid4().hex[:8]) as system:
            yield system


async def play_a_round(c: Clients, player: Player, table_id: str, variant: str, bet: table_pb2.PlaceBetRequest) -> None:
    await c.table.CreateTable(
        table_pb2.CreateTableRequest(table_id=table_id, variant=variant, limits=FAST), metadata=c.admin
    )
    watcher = Watcher(c, player, table_id)
    try:
        opened = await watcher.wait_for(lambda u: kind(u) == "round_opened", timeout_s=60)
        bet.table_id, bet.round_id, bet.command_id = table_id, opened.round_id, f"{opened.round_id}.{player.name}"
        await c.table.PlaceBet(bet, metadata=player.auth)
        await watcher.wait_for(update_is("result", opened.round_id), timeout_s=60)
    finally:
        await watcher.stop()


async def bet_through_the_gateway(gateway: str, player: Player, table_id: str, area: str) -> str:
    """Log in and bet on the next round over HTTPS (Connect, JSON); returns the round's id."""
    context = ssl.create_default_context(cafile=os.environ["NIUNIU_TLS_CA_FILE"])
    headers = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        login = {"username": player.name, "password": f"{player.name}-secret-pw"}
        async with session.post(f"{gateway}/niuniu.wallet.v1.Wallet/Login", json=login, headers=headers) as answer:
            assert answer.status == 200, await answer.text()
            token = (await answer.json())["token"]
        headers["Authorization"] = f"Bearer {token}"
        for _ in range(40):  # until a round is open for bets
            bet = {"commandId": uuid.uuid4().hex, "tableId": table_id, "area": area, "amountMinor": 200}
            async with session.post(f"{gateway}/niuniu.table.v1.Table/PlaceBet", json=bet, headers=headers) as answer:
                body = await answer.json()
            if answer.status == 200:
                return str(body["roundId"])
            await asyncio.sleep(0.25)
    raise AssertionError(f"no bet accepted through the gateway: {body}")


async def test_rounds_of_two_variants_settle_with_tls_on_every_link(tls_stack: Stack) -> None:
    gateway_proc, gateway = start_gateway(
        tls_stack,
        NIUNIU_GATEWAY_TLS_CERT_FILE=tls_stack.infra["NIUNIU_GATEWAY_TLS_CERT_FILE"],
        NIUNIU_GATEWAY_TLS_KEY_FILE=tls_stack.infra["NIUNIU_GATEWAY_TLS_KEY_FILE"],
    )
    try:
        assert gateway.startswith("https://")
        async with connect(tls_stack) as c:
            gold, bai = await register(c, "tlsgold", 100_000), await register(c, "tlsbai", 100_000)
            golden = table_pb2.PlaceBetRequest(area="area_1", amount_minor=300)
            await play_a_round(c, gold, "tls-golden", "golden_bull", golden)
            await c.table.CreateTable(
                table_pb2.CreateTableRequest(table_id="tls-bai", variant="bai_buu", limits=FAST), metadata=c.admin
            )
            watcher = Watcher(c, bai, "tls-bai")
            try:
                round_id = await bet_through_the_gateway(gateway, bai, "tls-bai", "player_01")
                await watcher.wait_for(update_is("result", round_id), timeout_s=60)
            finally:
                await watcher.stop()
            await settle_everything(c, [gold, bai])
            await ledger_matches_wallet(c)
    finally:
        stop(gateway_proc)
    with psycopg.connect(tls_stack.infra["DATABASE_URL"], sslrootcert=tls_stack.infra["PGSSLROOTCERT"]) as conn:
        plaintext = conn.execute(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)"
            " WHERE a.backend_type = 'client backend' AND NOT s.ssl"
        ).fetchone()
    assert plaintext == (0,)


async def test_a_grpc_client_without_a_certificate_is_refused(tls_stack: Stack) -> None:
    ca = Path(os.environ["NIUNIU_TLS_CA_FILE"]).read_bytes()
    request = wallet_pb2.LoginRequest(username="tlsgold", password="tlsgold-secret-pw")
    for channel in (
        grpc.aio.secure_channel(tls_stack.addr("wallet"), grpc.ssl_channel_credentials(root_certificates=ca)),
        grpc.aio.insecure_channel(tls_stack.addr("wallet")),
    ):
        async with channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await wallet_pb2_grpc.WalletStub(channel).Login(request, timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    async with connect(tls_stack) as c:  # the same call with the operator's certificate is answered
        with pytest.raises(grpc.aio.AioRpcError) as answered:
            await c.wallet.Login(wallet_pb2.LoginRequest(username="nobody-tls", password="wrong-password-1"))
        assert answered.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_plaintext_clients_of_the_tls_listeners_are_refused(tls_infra: dict[str, str]) -> None:
    bootstrap = tls_infra["KAFKA_BOOTSTRAP_SERVERS"]
    user, password = tls_infra["KAFKA_SASL_USERNAME"], tls_infra["KAFKA_SASL_PASSWORD"]
    sasl = {"sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": user, "sasl_plain_password": password}
    quick = {"request_timeout_ms": 3_000, "bootstrap_timeout_ms": 3_000}
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        make_admin(bootstrap, "tls-e2e-plaintext", security_protocol="SASL_PLAINTEXT", **sasl, **quick).close()
    with pytest.raises(ConnectionError):  # the health probe without TLS gets no ApiVersions answer either
        asyncio.run(asyncio.wait_for(KafkaProbe(bootstrap)(), timeout=10))
    tls = {"security_protocol": "SASL_SSL", "ssl_cafile": tls_infra["KAFKA_SSL_CAFILE"], "ssl_check_hostname": True}
    make_admin(bootstrap, "tls-e2e-tls", **tls, **sasl, **quick).close()  # the same principal over TLS: in
    asyncio.run(KafkaProbe(bootstrap, ssl.create_default_context(cafile=tls_infra["KAFKA_SSL_CAFILE"]))())
    dsn = tls_infra["DATABASE_URL"].replace("sslmode=verify-full", "sslmode=disable")
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(dsn, connect_timeout=5).close()
    plain_redis = tls_infra["REDIS_URL"].replace("rediss://", "redis://").split("?")[0]
    with pytest.raises(redis.RedisError):
        redis.Redis.from_url(plain_redis, socket_timeout=3, socket_connect_timeout=3).ping()
