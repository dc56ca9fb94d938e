"""niuniu-admin on the running system: an operator creates, configures and closes a table.

The tool runs as its own process (as from a port-forward or a Job), signs its admin token
with the issuer key (the development one here, as the stack's services do) and talks to the
table service over gRPC; each command prints the table as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from stack import ROOT, Stack

from backbone.auth import development_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def admin(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**development_env(os.environ), "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.run(
        [sys.executable, "-m", "tools.admin", "--table-addr", stack.addr("table"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def table(stack: Stack, *args: str) -> dict[str, Any]:
    done = admin(stack, "table", *args)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def test_an_operator_creates_configures_and_closes_a_table(stack: Stack) -> None:
    table_id = f"admin-{stack.run_id}"
    limits = ["min_bet_minor=100", "max_bet_minor=5000", "chips_minor=100,500", "betting_seconds=3"]
    created = table(stack, "create", table_id, "--variant", "golden_bull", *(f"--limit={x}" for x in limits))
    assert (created["tableId"], created["variant"]) == (table_id, "golden_bull")
    assert created["limits"]["chipsMinor"] == ["100", "500"]

    configured = table(stack, "configure", table_id, "--limit", "max_bet_minor=8000")
    assert configured["limits"]["maxBetMinor"] == "8000"
    assert configured["limits"]["minBetMinor"] == "100"  # the limits it did not name stay
    assert configured["configVersion"] > created.get("configVersion", 0)
    assert table(stack, "show", table_id)["limits"]["maxBetMinor"] == "8000"

    closed = table(stack, "close", table_id, "--wait-s", "90")
    assert closed["status"] == "closed"
    listed = table(stack, "list")
    assert {t["tableId"]: t["status"] for t in listed["tables"]}[table_id] == "closed"


def test_a_refusal_is_its_status_and_reason(stack: Stack) -> None:
    done = admin(stack, "table", "close", f"nope-{stack.run_id}", "--wait-s", "0")
    assert done.returncode == 1
    assert "NOT_FOUND" in done.stderr and "TABLE_NOT_FOUND" in done.stderr
    done = admin(stack, "table", "create", "x", "--variant", "golden_bull", "--limit", "min_bet=1")
    assert done.returncode == 2 and "no field 'min_bet'" in done.stderr
