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

from stack import BIN, ROOT, Stack, free_port  # noqa: E402

from services.gateway.server import check  # noqa: E402

ALLOWED_ORIGIN = "http://table.example.test"


@pytest.fixture(scope="module")
def stack(infra: dict[str, str]) -> Iterator[Stack]:
    run_id = uuid.uuid4().hex[:8]
    system = Stack(run_id, infra, ROOT / ".run" / "e2e" / run_id)
    try:
        system.start_all()
        yield system
    finally:
        system.stop_all()


def start_gateway(stack: Stack, name: str, **settings: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = stack.env("table")  # the development keys and the services' addresses (NIUNIU_TABLE_ADDR, ...)
    env.update({"NIUNIU_GATEWAY_PORT": str(port), "NIUNIU_GATEWAY_CORS_ORIGINS": ALLOWED_ORIGIN, **settings})
    log = (stack.log_dir / f"{name}.log").open("ab")
    proc = subprocess.Popen([str(BIN / "niuniu-gateway")], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    if not check(url + "/healthz", 30.0):
        proc.kill()
        raise RuntimeError(f"the gateway did not come up; see {stack.log_dir / name}.log")
    return proc, url


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@pytest.fixture
def allowed_origin() -> str:
    return ALLOWED_ORIGIN


@pytest.fixture(scope="module")
def gateway(stack: Stack) -> Iterator[str]:
    """The gateway's base URL (CORS open to ALLOWED_ORIGIN only)."""
    proc, url = start_gateway(stack, "gateway")
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
