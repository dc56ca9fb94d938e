"""Mutual TLS where configured: an rng process serving TLS that requires a client certificate of its CA."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import psycopg
import pytest
from niuniu.rng.v1 import rng_pb2, rng_pb2_grpc
from psycopg import sql
from stack import BIN, ROOT, free_port

from backbone import keys, tls
from backbone.auth import DEFAULT_TTL_S, ENV_MODE, KEY_ENV_VARS, Tokens, bearer
from backbone.config import service_dsn
from backbone.healthcheck import check
from tools.migrate import migrate

pytestmark = pytest.mark.integration

# Minted at import, so it lives as long as a login: it must outlive a long suite.
TABLE = bearer(Tokens.development().service_token("table", ttl_s=DEFAULT_TTL_S))


def key_env(directory: Path) -> dict[str, str]:
    return dict(line.removeprefix("export ").split("=", 1) for line in (directory / "env").read_text().splitlines())


@pytest.fixture(scope="module")
def tls_rng(infra: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    directory = tmp_path_factory.mktemp("tls") / "keys"
    keys.generate(directory, tls=True)
    material = {k: v for k, v in key_env(directory).items() if "TLS" in k}  # tokens: the development keys
    run_id = uuid.uuid4().hex[:8]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in KEY_ENV_VARS} | infra | material
    env |= {
        ENV_MODE: "development",
        "NIUNIU_RNG_GRPC_PORT": str(port),
        "NIUNIU_RNG_METRICS_PORT": str(free_port()),
        "NIUNIU_TOPIC_PREFIX": f"tls{run_id}.",
        "NIUNIU_DB_SCHEMA": f"tls_{run_id}",
    }
    migrate("rng", service_dsn("rng", env), env["NIUNIU_DB_SCHEMA"])  # a release's niuniu-migrate
    log = (directory.parent / "rng.log").open("ab")
    proc = subprocess.Popen([str(BIN / "niuniu-rng")], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    target = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while check_with(material, target) != "SERVING":
            assert proc.poll() is None, (directory.parent / "rng.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the TLS rng never served"
            time.sleep(0.5)
        yield target, material
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        with psycopg.connect(infra["DATABASE_URL"], autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"tls_{run_id}")))


def check_with(material: dict[str, str], target: str) -> str:
    saved = {k: os.environ.get(k) for k in material}
    os.environ.update(material)
    try:
        return check(target)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def commit(channel: grpc.aio.Channel) -> str:
    reply = await rng_pb2_grpc.RngStub(channel).Commit(
        rng_pb2.CommitRequest(round_id=f"tls-{uuid.uuid4().hex[:10]}", purpose="deck"), metadata=TABLE, timeout=10
    )
    return str(reply.commitment)


async def test_only_a_client_with_a_certificate_of_the_ca_gets_through(
    tls_rng: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    target, material = tls_rng
    async with tls.aio_channel(target, "table", material) as table:  # the table's own certificate
        assert len(await commit(table)) == 64
    ca = Path(material["NIUNIU_TLS_CA_FILE"]).read_bytes()
    keys.generate(tmp_path / "other", tls=True)
    other = tmp_path / "other"
    attempts = {
        "plaintext": grpc.aio.insecure_channel(target),
        "TLS without a client certificate": grpc.aio.secure_channel(
            target, grpc.ssl_channel_credentials(root_certificates=ca)
        ),
        "a certificate of another CA": grpc.aio.secure_channel(
            target,
            grpc.ssl_channel_credentials(
                root_certificates=ca,
                private_key=(other / "table-tls.key").read_bytes(),
                certificate_chain=(other / "table.crt").read_bytes(),
            ),
        ),
    }
    for how, channel in attempts.items():
        async with channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await commit(channel)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, how
