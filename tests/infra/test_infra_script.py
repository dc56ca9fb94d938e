"""scripts/infra reports the local stack (Kafka, PostgreSQL, Redis) healthy.

Needs the stack up (`scripts/infra up`; NIUNIU_RUN_DIR names another run dir); deselect with `-m "not integration"`.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "infra"
RUN = Path(os.environ.get("NIUNIU_RUN_DIR") or ROOT / ".run")
IDENTITIES = ("RNG", "TABLE", "WALLET", "LEDGER", "AUDITOR")


@pytest.mark.integration
def test_status_reports_every_component_healthy() -> None:
    proc = subprocess.run(
        ["bash", str(SCRIPT), "status"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"scripts/infra status exited {proc.returncode}:\n{report}"
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    for component in ("kafka", "postgres", "redis"):
        assert component in lines, f"no status line for {component}:\n{report}"
        assert lines[component].split()[1] == "healthy", lines[component]


@pytest.mark.integration
def test_env_file_points_at_the_running_stack() -> None:
    env_file = RUN / "env"
    assert env_file.is_file(), "scripts/infra up writes .run/env"
    exported = dict(
        line.removeprefix("export ").split("=", 1)
        for line in env_file.read_text().splitlines()
        if line.startswith("export ")
    )
    for name in (
        "KAFKA_BOOTSTRAP_SERVERS",
        "DATABASE_URL",
        "NIUNIU_RNG_DSN",
        "NIUNIU_TABLE_DSN",
        "NIUNIU_WALLET_DSN",
        "NIUNIU_LEDGER_DSN",
        "REDIS_URL",
        "KAFKA_SASL_USERNAME",
        "KAFKA_SASL_PASSWORD",
        "NIUNIU_AUDITOR_DSN",
        *(f"NIUNIU_{s}_KAFKA_{k}" for s in IDENTITIES for k in ("USER", "PASSWORD")),
    ):
        assert exported.get(name), f"{name} missing from {env_file}"
    assert exported["DATABASE_URL"].endswith("/niuniu_test")
    assert exported["KAFKA_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT"
    # one role per database, each with its own password
    roles = {name: urlsplit(exported[f"NIUNIU_{name}_DSN"]) for name in ("RNG", "TABLE", "WALLET", "LEDGER")}
    for name, url in roles.items():
        assert url.username == f"niuniu_{name.lower()}" and url.path == f"/niuniu_{name.lower()}", url
        assert url.password and len(url.password) >= 32
    assert len({url.password for url in roles.values()}) == len(roles)
    assert urlsplit(exported["REDIS_URL"]).password


@pytest.mark.integration
def test_credentials_are_readable_by_their_owner_only() -> None:
    assert stat.S_IMODE((RUN / "env").stat().st_mode) == 0o600
    secrets = RUN / "secrets"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    files = list(secrets.iterdir())
    assert files, "scripts/infra up keeps the generated passwords in .run/secrets"
    for file in files:
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    assert stat.S_IMODE((RUN / "kafka" / "server.properties").stat().st_mode) == 0o600  # holds the admin password
