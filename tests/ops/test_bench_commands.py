"""The backbone's two benchmark commands on the real stack, CI-sized: each prints its figures beside
the same run's limits of the components underneath, and leaves neither schemas nor topics behind.
What the figures are on this machine is docs/benchmarks.md's business; here, that every one is printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from backbone.kafka import make_admin

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 300


def _topics(infra: dict[str, str]) -> set[str]:
    admin = make_admin(infra["KAFKA_BOOTSTRAP_SERVERS"], "test-bench-commands")
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def _schemas(infra: dict[str, str], like: str) -> set[str]:
    with psycopg.connect(infra["DATABASE_URL"]) as conn:
        return {str(r[0]) for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (like,))}


def _run(infra: dict[str, str], *command: str) -> str:
    done = subprocess.run(
        [str(Path(sys.executable).parent / command[0]), *command[1:]],
        env={**os.environ, **infra},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    return text


def _figure(text: str, name: str) -> float:
    found = re.search(rf"^\s+{name}\s+([0-9.]+)", text, re.MULTILINE)
    assert found is not None, f"{name} not printed:\n{text[-3000:]}"
    return float(found.group(1))


def test_bench_replay_prints_the_replay_as_the_audit_runs_it_and_with_the_indexes(infra: dict[str, str]) -> None:
    topics_before, schemas_before = _topics(infra), _schemas(infra, "ledger\\_bench\\_%")
    text = _run(infra, "niuniu-audit", "bench-replay", "--events", "3000", "--dsn", infra["DATABASE_URL"])
    read = re.search(r"ledger replay benchmark, (\d+) events \((\d+) journal entries\)", text)
    assert read is not None and int(read.group(1)) >= 3000 and int(read.group(2)) > 0, text[-3000:]
    rate, with_indexes = _figure(text, "replay_events_per_s"), _figure(text, "with_indexes_per_s")
    assert _figure(text, "plain_indexes_seconds") > 0
    assert 0 < with_indexes < rate  # the same events, and the indexes' time on top
    assert _figure(text, "kafka_parse_per_s") > 0
    assert re.search(r"kafka_read\s+\d+/s \(Kafka's ConsumerPerformance", text), text[-3000:]
    assert re.search(r"postgres\s+\d+/s \(pgbench", text), text[-3000:]
    assert _schemas(infra, "ledger\\_bench\\_%") == schemas_before
    assert {t for t in _topics(infra) - topics_before if t.startswith("bench")} == set()


def test_bench_replay_by_workers_replays_the_same_events_each_way_and_prints_the_scaling(
    infra: dict[str, str],
) -> None:
    schemas_before = _schemas(infra, "ledger\\_bench\\_%")
    text = _run(infra, "niuniu-audit", "bench-replay", "--events", "3000", "--workers", "1,2")
    read = re.search(r"ledger replay benchmark, (\d+) events \((\d+) journal entries\)", text)
    assert read is not None, text[-3000:]
    events, entries = read.groups()
    for workers in (1, 2):
        line = rf"workers={workers} \(no CPU quota\): replay_seconds [0-9.]+, replay_events_per_s \d+, {events} events"
        assert re.search(rf"{line}, {entries} entries", text), text[-3000:]
    assert re.search(r"postgres\s+\d+/s \(pgbench", text), text[-3000:]
    assert _figure(text, "kafka_parse_per_s") > 0
    scaling = re.search(r"^scaling: workers=1 (\d+) events/s, workers=2 (\d+) events/s \(([0-9.]+)x\)$", text, re.M)
    assert scaling is not None and int(scaling.group(1)) > 0, text[-3000:]
    assert _schemas(infra, "ledger\\_bench\\_%") == schemas_before


def test_niuniu_bench_prints_each_stage_beside_postgresql_and_kafka(infra: dict[str, str]) -> None:
    topics_before, schemas_before = _topics(infra), _schemas(infra, "bench\\_%")
    text = _run(infra, "niuniu-bench", "--events", "400", "--writers", "4")
    assert "backbone benchmark, 400 events, 4 writers" in text, text[-3000:]
    for name in (
        "append_events_per_s",
        "append_pipelined_per_s",
        "append_10_per_call_per_s",
        "publish_events_per_s",
        "consume_events_per_s",
        "consume_batched_per_s",
    ):
        assert _figure(text, name) > 0, name
    assert re.search(r"PostgreSQL\s+\d+/s \(pgbench", text), text[-3000:]
    assert re.search(r"append = [0-9.]+ % of it", text), text[-3000:]
    assert re.search(r"Kafka read\s+\d+/s", text) and re.search(r"Kafka write\s+\d+/s", text), text[-3000:]
    assert _schemas(infra, "bench\\_%") == schemas_before
    assert {t for t in _topics(infra) - topics_before if t.startswith("bench")} == set()


def test_bench_calm_prints_each_step_calm_and_in_a_crowd_and_a_bets_path(infra: dict[str, str]) -> None:
    text = _run(infra, "python", "-m", "backbone.bench_calm", "--seconds", "0.5", "--runs", "2", "--rate", "50")
    assert "min / median / max of 2 runs of 0.5 s (calm: 50 a second, open loop" in text, text[-3000:]
    number = r"([0-9.]+) / ([0-9.]+) / ([0-9.]+)"
    for step, far in (("call", "server"), ("transaction", "backend")):
        for kind in ("calm", "crowd"):
            line = re.search(rf"^  {step}, {kind}\s+{number}/s\s+here {number}\s+{far} {number}$", text, re.M)
            assert line is not None, (step, kind, text[-3000:])
            rate_min, rate_median, rate_max, *cpu = (float(g) for g in line.groups())
            assert 0 < rate_min <= rate_median <= rate_max, line.group(0)
            assert cpu[0] <= cpu[1] <= cpu[2] and cpu[3] <= cpu[4] <= cpu[5] and cpu[0] > 0, line.group(0)
    assert re.search(r"^PostgreSQL underneath, right after: \d+/s \(pgbench", text, re.M), text[-3000:]
    path = re.search(
        r"^a bet's path \(2 calls, 3 transactions\), .*: calm ([0-9.]+) ms, crowd ([0-9.]+) ms", text, re.M
    )
    assert path is not None and float(path.group(1)) > 0 and float(path.group(2)) > 0, text[-3000:]
