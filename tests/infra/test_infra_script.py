"""scripts/infra reports the local stack (Kafka, PostgreSQL, Redis) healthy.

Needs the stack up (`scripts/infra up`); deselect with `-m "not integration"`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "infra"


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
    env_file = ROOT / ".run" / "env"
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
    ):
        assert exported.get(name), f"{name} missing from {env_file}"
    assert exported["DATABASE_URL"].endswith("/niuniu_test")
