"""niuniu-chaos sized for CI: every fault kind once, on its own infrastructure, and every check passes.

The run starts a Kafka, a PostgreSQL and a Redis of its own (scripts/infra in a temporary run
directory, free ports), so it can kill and restart them without disturbing the other tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest

from tools.chaos.run import FAULT_KINDS, parse_args, schedule
from tools.chaos.stack import BIN, ROOT

CI_SEED = 18
CI_TIMEOUT_S = 1_800


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
def test_every_fault_kind_once_and_every_check_passes(tmp_path: Path) -> None:
    report_path = tmp_path / "chaos.json"
    argv = [str(BIN / "niuniu-chaos"), "--seed", str(CI_SEED), "--rounds", "0", "--cycles", "1"]
    argv += ["--tables-per-variant", "1"]
    argv += ["--report", str(report_path), "--run-dir", str(tmp_path / "run"), "--keep"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=CI_TIMEOUT_S, cwd=ROOT, check=False)
    sys.stdout.write(run.stdout[-20_000:])
    assert report_path.exists(), run.stdout[-3_000:] + run.stderr[-3_000:]
    report = json.loads(report_path.read_text())
    failed = [c for c in report["checks"] if not c["ok"]]
    assert not failed, json.dumps(failed, indent=1)
    for kind in FAULT_KINDS:
        row = report["kinds"][kind]
        assert row["injected"] >= 1 and row["survived"] == row["injected"], (kind, row)
    assert {t["variant"] for t in report["tables"]} == {"golden_bull", "baibian_bull", "bai_buu", "red_envelope_bull"}
    assert all(t["rounds_ended"] > 0 for t in report["tables"])
    assert run.returncode == 0 and "RESULT: OK" in run.stdout
