"""``python -m tools.takeover``, CI-sized: three replicas of the table, the wallet and the ledger under load, one of
each SIGKILLed in turn. What the dead replica owned is owned and worked on again, and afterwards no accepted
bet is lost or applied twice and the audit's replay finds no difference. The times are printed, not judged."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from backbone.kafka import make_admin
from tools.takeover import moved_parts, owner_pid

RUN_TIMEOUT_S = 400


def test_lease_values_and_names_are_read_as_the_services_write_them() -> None:
    assert owner_pid(b"pod-a-7-1234-140245|17") == 1234  # <host>-<pid>-<context>|<token>; hosts have dashes
    assert owner_pid("host-99-1|3") == 99
    assert owner_pid(None) is None
    assert owner_pid(b"garbage|1") is None
    names = [
        "consumer:loadab12.wallet-settlement:load_ab12_wallet:loadab12.niuniu.table.events:4",
        "relay:loadab12.wallet:load_ab12_wallet:loadab12.niuniu.wallet.events:2",
        "table:loadab12.takeover-ab12-3",
    ]
    assert moved_parts(names) == ["wallet-settlement:loadab12.niuniu.table.events:4"]


@pytest.mark.integration
def test_one_replica_of_each_killed_in_turn_loses_nothing_and_applies_nothing_twice(
    infra: dict[str, str], tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "tools.takeover"]
    command += ["--tables", "9", "--players", "18", "--in-flight", "4", "--log-dir", str(tmp_path)]
    done = subprocess.run(
        command, env={**os.environ, **infra}, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    text = done.stdout + done.stderr
    takeovers = re.findall(r"^takeover: (\w+)-\d killed \(it owned ([^)]*)\): (.*)$", text, flags=re.M)
    assert [service for service, _, _ in takeovers] == ["table", "wallet", "ledger"], text[-4000:]
    for service, owned, outcome in takeovers:
        assert re.search(r"[1-9]\d* partitions", owned), (service, owned)  # it owned something to move
        assert "owned again after" in outcome, (service, outcome)  # ... and all of it was owned again
    assert "tables" in takeovers[0][1] and "first bet accepted on a moved table after" in takeovers[0][2], takeovers
    assert "first record applied on a moved partition after" in takeovers[2][2], takeovers  # the journal never idles
    during = re.findall(r"^  during it: (\d+) calls, p50 [0-9.]+ ms, p99 ([0-9.]+) ms", text, flags=re.M)
    assert len(during) == 3 and all(int(calls) > 0 for calls, _ in during), text[-4000:]
    accepted = re.search(r"OK   no accepted bet lost: (\d+) accepted, 0 not recorded, 0 with another hold", text)
    assert accepted is not None and int(accepted.group(1)) > 0, text[-4000:]
    assert "OK   nothing applied twice: wallet 0, journal 0 " in text, text[-4000:]
    assert "OK   every table and partition owned by a live replica" in text, text[-4000:]
    assert re.search(r"^  differences: 0$", text, flags=re.M), text[-4000:]
    assert not re.search(r"^  FAIL ", text, flags=re.M), text[-4000:]
    assert done.returncode == 0 and done.stdout.rstrip().endswith("RESULT: OK"), text[-4000:]
    run = re.search(r"logs in .*/([0-9a-f]+)\)", text)
    assert run is not None
    _nothing_left(infra, run.group(1))


def _nothing_left(infra: dict[str, str], run: str) -> None:
    admin = make_admin(infra["KAFKA_BOOTSTRAP_SERVERS"], "test-load-takeover")
    try:
        assert [t for t in admin.list_topics() if t.startswith(f"load{run}.")] == []
    finally:
        admin.close()
    with psycopg.connect(infra["DATABASE_URL"]) as conn:
        schemas = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (f"load_{run}_%",))
        assert schemas.fetchall() == []
