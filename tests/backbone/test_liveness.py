"""Liveness apart from readiness: a real rng process whose own PostgreSQL is stopped for 40 s stays
alive and its ``liveness`` health entry SERVING throughout, while its readiness (the overall entry)
goes NOT_SERVING and comes back once the database is back, with no restart of the process.

The database is a scratch cluster of this test's own (initdb, pg_ctl on a free port): the shared
PostgreSQL keeps running. Kafka and Redis are the shared ones.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backbone.auth import development_env
from backbone.healthcheck import LIVENESS, check
from backbone.localports import free_port
from tools.migrate import migrate

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
OUTAGE_S = 40.0
"""How long the database stays down: longer than a failover, and than the probes' failure thresholds."""
BACK_TIMEOUT_S = 60.0


def _pg_bin() -> Path:
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        pytest.skip("no PostgreSQL server binaries (pg_config) on this machine")
    return Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True).stdout.strip())


class ScratchPostgres:
    """A throw-away cluster in ``data``, listening on 127.0.0.1:``port``, trusting local connections."""

    def __init__(self, root: Path) -> None:
        self.bin = _pg_bin()
        self.root, self.data, self.port = root, root / "data", free_port()
        self.as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        done = subprocess.run([*self.as_pg, *argv], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{argv[0]}: {done.stdout}{done.stderr}"

    def init(self) -> None:
        if self.as_pg:
            shutil.chown(self.root, "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8")

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root}"
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "pg.log"),
            "-o",
            options,
            "-w",
            "start",
        )

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")


@pytest.fixture
def scratch_pg() -> Iterator[ScratchPostgres]:
    # Not under pytest's temporary root (mode 0700): the server runs as the postgres user when we are root.
    root = Path(tempfile.mkdtemp(prefix="niuniu-pg-"))
    root.chmod(0o755)
    pg = ScratchPostgres(root)
    try:
        pg.init()
        pg.start()
        yield pg
    finally:
        subprocess.run([*pg.as_pg, str(pg.bin / "pg_ctl"), "-D", str(pg.data), "-m", "immediate", "stop"], check=False)
        shutil.rmtree(root, ignore_errors=True)


def _env(infra: dict[str, str], pg: ScratchPostgres, unique: str, port: int) -> dict[str, str]:
    env = development_env(os.environ) | infra
    return env | {
        "NIUNIU_RNG_DSN": pg.dsn,
        "NIUNIU_TOPIC_PREFIX": f"t{unique}.",
        "NIUNIU_RNG_GRPC_PORT": str(port),
        "NIUNIU_RNG_METRICS_PORT": str(free_port()),
    }


def _wait(target: str, service: str, status: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check(target, service=service) == status:
            return True
        time.sleep(0.25)
    return False


def test_a_database_outage_leaves_liveness_serving_and_readiness_comes_back(
    infra: dict[str, str], scratch_pg: ScratchPostgres, unique: str, tmp_path: Path
) -> None:
    migrate("rng", scratch_pg.dsn)
    port = free_port()
    target = f"127.0.0.1:{port}"
    log = (tmp_path / "rng.log").open("wb")
    proc = subprocess.Popen(
        [str(BIN / "niuniu-rng")], env=_env(infra, scratch_pg, unique, port), stdout=log, stderr=log, cwd=ROOT
    )
    try:
        assert _wait(target, "", "SERVING", BACK_TIMEOUT_S), (tmp_path / "rng.log").read_text()
        scratch_pg.stop()
        liveness, readiness = set(), set()
        until = time.monotonic() + OUTAGE_S
        while time.monotonic() < until:
            liveness.add(check(target, service=LIVENESS))
            readiness.add(check(target))
            assert proc.poll() is None, (tmp_path / "rng.log").read_text()
            time.sleep(0.5)
        scratch_pg.start()
        assert liveness == {"SERVING"}
        assert "NOT_SERVING" in readiness
        assert _wait(target, "", "SERVING", BACK_TIMEOUT_S), (tmp_path / "rng.log").read_text()
        assert check(target, service=LIVENESS) == "SERVING"
        assert proc.poll() is None  # the same process throughout: nothing restarted it
    finally:
        proc.terminate()
        proc.wait(timeout=30)
