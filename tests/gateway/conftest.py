"""The real system (four service processes) with the browser gateway in front, shared by a module."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

E2E = Path(__file__).resolve().parents[1] / "e2e"
if str(E2E) not in sys.path:
    sys.path.insert(0, str(E2E))  # the end-to-end stack and its clients, imported by their bare names

from stack import Stack, free_port, running_stack, stop  # noqa: E402
from stack import start_gateway as start_stack_gateway  # noqa: E402

ALLOWED_ORIGIN = "http://table.example.test"


@pytest.fixture(scope="module")
def stack(infra: dict[str, str]) -> Iterator[Stack]:
    with running_stack(infra, uuid.uuid4().hex[:8]) as system:
        yield system


def start_gateway(stack: Stack, name: str, **settings: str) -> tuple[subprocess.Popen[bytes], str]:
    """A gateway whose CORS is open to ALLOWED_ORIGIN only (besides its own pages)."""
    return start_stack_gateway(stack, name, **{"NIUNIU_GATEWAY_CORS_ORIGINS": ALLOWED_ORIGIN, **settings})


@pytest.fixture
def allowed_origin() -> str:
    return ALLOWED_ORIGIN


@pytest.fixture(scope="module")
def gateway_metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def gateway_metrics(gateway_metrics_port: int) -> str:
    """The /metrics URL of ``gateway``."""
    return f"http://127.0.0.1:{gateway_metrics_port}/metrics"


@pytest.fixture(scope="module")
def gateway(stack: Stack, gateway_metrics_port: int) -> Iterator[str]:
    """The gateway's base URL (CORS open to ALLOWED_ORIGIN only)."""
    proc, url = start_gateway(stack, "gateway", NIUNIU_GATEWAY_METRICS_PORT=str(gateway_metrics_port))
    try:
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def static_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("static")
    (root / "index.html").write_text("<!doctype html><title>table</title>")
    (root / "app.js").write_text("console.log('table');")
    (root / ".env").write_text("SECRET=1")
    return root


@pytest.fixture(scope="module")
def tight_gateway(stack: Stack, static_dir: Path) -> Iterator[str]:
    """A second gateway with tiny limits (one stream at a time, 256-byte bodies) serving ``static_dir``."""
    proc, url = start_gateway(
        stack,
        "gateway-tight",
        NIUNIU_GATEWAY_MAX_STREAMS="1",
        NIUNIU_GATEWAY_MAX_BODY_BYTES="256",
        NIUNIU_GATEWAY_STATIC_DIR=str(static_dir),
    )
    try:
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def capped_gateway(stack: Stack) -> Iterator[str]:
    """A gateway that lets one caller hold one stream and one address two (ten in all)."""
    proc, url = start_gateway(
        stack,
        "gateway-capped",
        NIUNIU_GATEWAY_MAX_STREAMS="10",
        NIUNIU_GATEWAY_MAX_STREAMS_PER_ADDRESS="2",
        NIUNIU_GATEWAY_MAX_STREAMS_PER_CALLER="1",
    )
    try:
        yield url
    finally:
        stop(proc)
