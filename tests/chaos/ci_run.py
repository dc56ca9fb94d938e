"""The CI chaos run as a subprocess (started and checked by tests/chaos, last in the session; see conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tools.chaos.stack import BIN, ROOT

CI_TEST = "test_every_fault_kind_once_and_every_check_passes"
CI_SEED = 18
CI_TIMEOUT_S = 1_800
RUN_DIR = ROOT / ".run" / "chaos-ci"  # the last CI run's infrastructure logs and report, kept until the next
STOP_TIMEOUT_S = 120


@dataclass
class BackgroundRun:
    proc: subprocess.Popen[bytes]
    report: Path
    output: Path
    started: float

    def stop(self) -> None:
        """SIGTERM if still running: the run stops its services and its infrastructure."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def start_ci_run() -> BackgroundRun:
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    RUN_DIR.mkdir(parents=True)
    report, output = RUN_DIR / "chaos.json", RUN_DIR / "output.txt"
    argv = [str(BIN / "niuniu-chaos"), "--seed", str(CI_SEED), "--rounds", "0", "--cycles", "1"]
    argv += ["--tables-per-variant", "1", "--report", str(report), "--run-dir", str(RUN_DIR / "run"), "--keep"]
    with output.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    return BackgroundRun(proc, report, output, time.monotonic())
