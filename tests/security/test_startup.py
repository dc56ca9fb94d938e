"""A service refuses to start without real key material, and with the repository's development keys
outside development mode (each one a real ``niuniu-<service>`` process)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from stack import BIN, ROOT

from backbone import keys
from backbone.auth import ENV_MODE, ISSUER, KEY_ENV_VARS, SERVICES, SigningKey, service_owner
from backbone.config import service_dsn
from tools.migrate import migrate

pytestmark = pytest.mark.integration

EXIT_CONFIG = 2
TIMEOUT_S = 60


def base_env(infra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*KEY_ENV_VARS, ENV_MODE)}
    env.update(infra)
    for service in SERVICES:  # never disturb a running stack: free ports
        env[f"NIUNIU_{service.upper()}_GRPC_PORT"] = "0"
        env[f"NIUNIU_{service.upper()}_METRICS_PORT"] = "0"
    return env


def run(service: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / f"niuniu-{service}")], env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def key_env(directory: Path) -> dict[str, str]:
    lines = (directory / "env").read_text().splitlines()
    return dict(line.removeprefix("export ").split("=", 1) for line in lines)


@pytest.mark.parametrize("service", SERVICES)
def test_without_key_material_and_without_development_mode_a_service_exits(infra: dict[str, str], service: str) -> None:
    for mode in (None, "production"):
        env = base_env(infra)
        if mode:
            env[ENV_MODE] = mode
        done = run(service, env)
        assert done.returncode == EXIT_CONFIG, done.stderr
        assert f"niuniu-{service}: refusing to start:" in done.stderr
        assert f"NIUNIU_{service.upper()}_KEY_FILE is not set" in done.stderr
        assert "NIUNIU_ENV=development" in done.stderr  # the message says what to do


def test_an_unknown_event_loop_is_refused_before_anything_starts(infra: dict[str, str], tmp_path: Path) -> None:
    keys.generate(tmp_path)
    env = base_env(infra) | key_env(tmp_path) | {"NIUNIU_EVENT_LOOP": "tokio"}
    done = run("rng", env)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "niuniu-rng: refusing to start: NIUNIU_EVENT_LOOP must be uvloop or asyncio, not 'tokio'" in done.stderr


def test_the_wallet_needs_the_issuer_key_too(infra: dict[str, str], tmp_path: Path) -> None:
    keys.generate(tmp_path)
    env = base_env(infra) | key_env(tmp_path)
    del env["NIUNIU_ISSUER_KEY_FILE"]
    done = run("wallet", env)
    assert done.returncode == EXIT_CONFIG and "NIUNIU_ISSUER_KEY_FILE is not set" in done.stderr


@pytest.mark.parametrize("service", ["table", "wallet"])
def test_the_repository_development_keys_are_refused_outside_development_mode(
    infra: dict[str, str], tmp_path: Path, service: str
) -> None:
    """Configured explicitly as files, as an operator copying a laptop's setup would: still refused."""
    owners = [ISSUER, *(service_owner(s) for s in SERVICES)]
    developments = {owner: SigningKey.development(owner) for owner in owners}
    env = base_env(infra)
    for owner, key in developments.items():
        path = tmp_path / f"{owner.replace(':', '_')}.pem"
        path.write_bytes(key.pem())
        var = (
            "NIUNIU_ISSUER_KEY_FILE" if owner == ISSUER else f"NIUNIU_{owner.removeprefix('service:').upper()}_KEY_FILE"
        )
        env[var] = str(path)
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [k.trusted.jwk() for k in developments.values()]}))
    env["NIUNIU_JWKS_FILE"] = str(jwks)
    done = run(service, env)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "refusing the development key" in done.stderr and "written in the repository" in done.stderr


def test_real_keys_start_a_service_outside_development_mode(infra: dict[str, str], tmp_path: Path) -> None:
    """The control: the same process with generated keys gets past the key check (and serves)."""
    keys.generate(tmp_path)
    schema = f"startup_{os.getpid()}_{tmp_path.name[-8:]}".replace("-", "_").lower()
    env = base_env(infra) | key_env(tmp_path)
    env |= {ENV_MODE: "production", "NIUNIU_TOPIC_PREFIX": f"{schema}.", "NIUNIU_DB_SCHEMA": schema}
    migrate("rng", service_dsn("rng", env), schema)  # a release's niuniu-migrate
    proc = subprocess.Popen(
        [str(BIN / "niuniu-rng")], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "serving" in line and "grpc_port" in line:
                break
        else:
            pytest.fail(f"the rng exited with {proc.wait()} instead of serving")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        with psycopg.connect(infra["DATABASE_URL"], autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
