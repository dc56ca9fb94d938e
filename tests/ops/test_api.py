"""Protos: buf lint, no breaking change against main, and the API reference is current."""

from __future__ import annotations

import subprocess
import sys

from ops_support import ROOT, buf, run_check_deploy


def test_buf_lint() -> None:
    done = subprocess.run([buf(), "lint"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_breaking_change_against_main() -> None:
    buf()
    done = run_check_deploy("protos")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: buf breaking against main" in done.stdout or "SKIP buf breaking" in done.stderr


def test_api_reference_matches_the_protos() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "apidocs.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"run scripts/gen-api-docs\n{done.stderr}"


def test_api_reference_covers_every_service() -> None:
    index = (ROOT / "docs" / "api" / "README.md").read_text()
    for proto in sorted((ROOT / "protos").rglob("*.proto")):
        assert f"`{proto.relative_to(ROOT / 'protos')}`" in index
        for line in proto.read_text().splitlines():
            if line.startswith("service "):
                assert f"[{line.split()[1]}]" in index
