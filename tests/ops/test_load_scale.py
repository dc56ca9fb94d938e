"""``niuniu-load --replicas``, CI-sized: one replica of each service, then two, each held to a CPU quota in a
cgroup of its own; every replica takes a share of every kind of work it does, the run ends with the scaling
line, and no CPU group, schema or topic is left behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from backbone.cpuquota import CPU_ROOT, unavailable_reason
from backbone.kafka import make_admin

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(unavailable_reason()), reason=f"CPU quotas: {unavailable_reason()}"),
]

RUN_TIMEOUT_S = 600
SERVICES = ("rng", "wallet", "ledger", "table")


def test_two_replicas_of_each_service_share_the_work_under_a_cpu_quota(infra: dict[str, str], tmp_path: Path) -> None:
    command = [
        str(Path(sys.executable).parent / "niuniu-load"),
        *("--replicas", "1,2", "--cpu-per-replica", "0.2"),
        *("--tables", "4", "--players", "12", "--in-flight", "8", "--warmup", "3", "--duration", "6"),
        *("--log-dir", str(tmp_path)),
    ]
    done = subprocess.run(
        command, env={**os.environ, **infra}, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    sections = re.split(r"^== (\d) replicas? of each service \(0.2 of a core each\) ==$", text, flags=re.M)
    assert sections[1::2] == ["1", "2"], text[-3000:]
    for n, section in zip((1, 2), sections[2::2], strict=True):
        assert f"each of the {4 * n} replicas held to 0.2 of a core" in section, section[-3000:]
        busy = re.search(r"; machine ([0-9.]+) of \d+ busy", section)
        assert busy is not None and float(busy.group(1)) > 0, section[-3000:]
        assert re.search(r"PostgreSQL right after: \d+/s \(pgbench", section), section[-3000:]
        work = {
            service: line for service in SERVICES if (line := _line(section, rf"^    {service} +(.*)$")) is not None
        }
        assert set(work) == set(SERVICES), section[-3000:]
        # Each replica of the table answered calls, holds tables and published; each of the wallet answered
        # calls, applied settlements and published; each ledger replica applied records.
        for service, kinds in {
            "table": ("calls served", "tables owned", "events published"),
            "wallet": ("calls served", "events published"),
            "ledger": ("records applied",),
        }.items():
            for kind in kinds:
                counts = re.search(rf"{kind} ([0-9 /]+) \(([0-9. /]+)\)", work[service])
                assert counts is not None, (service, kind, section[-3000:])
                numbers = [float(c) for c in counts.group(1).split(" / ")]
                assert len(numbers) == n and all(c > 0 for c in numbers), (service, kind, work[service])
        tables = re.search(r"tables owned ([0-9 /]+) ", work["table"])
        assert tables is not None and sum(int(c) for c in tables.group(1).split(" / ")) == 4, work["table"]
    last = text.strip().splitlines()[-1]
    scaling = re.fullmatch(r"scaling: N=1 (\d+), N=2 (\d+) \(([0-9.]+)x\)", last)
    assert scaling is not None, text[-3000:]
    one, two, ratio = int(scaling.group(1)), int(scaling.group(2)), float(scaling.group(3))
    assert one > 0 and two > 0 and abs(ratio - two / one) < 0.05 * ratio + 0.01, last
    runs = re.findall(r"logs in .*/([0-9a-f]+)\)", text)
    assert len(runs) == 2, text[:500]
    _nothing_left(infra, runs)


def _line(text: str, pattern: str) -> str | None:
    found = re.search(pattern, text, flags=re.M)
    return found.group(1) if found else None


def _nothing_left(infra: dict[str, str], runs: list[str]) -> None:
    """No CPU group of the runs, and neither their schemas nor their topics."""
    parent = CPU_ROOT / "niuniu-load"
    left = [g.name for g in parent.iterdir() if g.is_dir()] if parent.is_dir() else []
    assert not [g for g in left if g.startswith(tuple(runs))], left
    admin = make_admin(infra["KAFKA_BOOTSTRAP_SERVERS"], "test-load-scale")
    try:
        topics = [t for t in admin.list_topics() if t.startswith(tuple(f"load{run}." for run in runs))]
    finally:
        admin.close()
    assert topics == []
    with psycopg.connect(infra["DATABASE_URL"]) as conn:
        for run in runs:
            schemas = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (f"load_{run}_%",))
            assert schemas.fetchall() == []
