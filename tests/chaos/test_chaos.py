"""niuniu-chaos sized for CI: every fault kind once, on its own infrastructure, and every check passes.

Two replicas of every service run, all active, and each shows its share of the work (calls served, tables
taken, events published, records applied) in the report.

The run starts a Kafka, a PostgreSQL and a Redis of its own (scripts/infra in its run directory,
.run/chaos-ci/run, free ports), so it can kill and restart them without disturbing the other
tests; its test comes last in the session (conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from itertools import islice

import pytest

from tests.chaos.ci_run import CI_SEED, CI_TIMEOUT_S, BackgroundRun
from tools.chaos.run import FAULT_KINDS, WORK_KINDS, parse_args, schedule


def test_the_same_seed_draws_the_same_schedule() -> None:
    first = list(islice(schedule(CI_SEED, FAULT_KINDS, 4), 3 * len(FAULT_KINDS)))
    again = list(islice(schedule(CI_SEED, FAULT_KINDS, 4), 3 * len(FAULT_KINDS)))
    other = list(islice(schedule(CI_SEED + 1, FAULT_KINDS, 4), 3 * len(FAULT_KINDS)))
    assert first == again
    assert first != other
    for cycle in range(3):  # each cycle injects every kind once, in an order of its own
        kinds = [f.kind for f in first[cycle * len(FAULT_KINDS) : (cycle + 1) * len(FAULT_KINDS)]]
        assert sorted(kinds) == sorted(FAULT_KINDS)
    assert all(0 <= f.table < 4 and f.trigger for f in first)
    assert all(f.duration_s > 5.0 for f in first if f.kind == "sigstop")  # longer than the table's lease


def test_unknown_fault_kinds_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--faults", "kill_rng,meteor"])
    assert exit_.value.code == 2
    assert "meteor" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(CI_TIMEOUT_S + 60)
def test_every_fault_kind_once_and_every_check_passes(ci_chaos_run: BackgroundRun) -> None:
    """Last in the session, alone (conftest.py): the run, then its report."""
    left = CI_TIMEOUT_S - (time.monotonic() - ci_chaos_run.started)
    try:
        returncode = ci_chaos_run.proc.wait(max(left, 1.0))
    except subprocess.TimeoutExpired:
        pytest.fail(f"niuniu-chaos still running after {CI_TIMEOUT_S} s")
    output = ci_chaos_run.output.read_text(errors="replace")
    sys.stdout.write(output[-20_000:])
    assert ci_chaos_run.report.exists(), output[-6_000:]
    report = json.loads(ci_chaos_run.report.read_text())
    failed = [c for c in report["checks"] if not c["ok"]]
    assert not failed, json.dumps(failed, indent=1)
    for kind in FAULT_KINDS:
        row = report["kinds"][kind]
        assert row["injected"] >= 1 and row["survived"] == row["injected"], (kind, row)
    assert {t["variant"] for t in report["tables"]} == {"golden_bull", "baibian_bull", "bai_buu", "red_envelope_bull"}
    assert all(t["rounds_ended"] > 0 for t in report["tables"])
    # Two replicas of every service, all active: each of those serving at the end did its service's work.
    assert set(report["replicas"]) == set(WORK_KINDS), report["replicas"]
    for service, kinds in WORK_KINDS.items():
        replicas = report["replicas"][service]
        assert len(replicas) == 2, (service, replicas)
        for name in replicas:
            assert all(report["work"][name][kind] > 0 for kind in kinds), (name, report["work"][name])
    assert returncode == 0 and "RESULT: OK" in output
