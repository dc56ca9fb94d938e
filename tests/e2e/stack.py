"""The whole system as separate processes, for end-to-end tests.

Each service runs as its own ``niuniu-<service>`` process against the real Kafka,
PostgreSQL and Redis, with a topic prefix and a database schema of its own run so
runs never see each other's events. Services can be killed (SIGKILL, no goodbye)
and restarted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from backbone.auth import development_env
from backbone.healthcheck import check
from backbone.localports import (
    free_port as free_port,
)  # re-exported; below the ephemeral ports: no client connection takes it first
from services.gateway.server import check as http_ready

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SERVICES = ("rng", "wallet", "ledger", "table")
HEALTH_TIMEOUT_S = 60.0


@dataclass
class Stack:
    run_id: str
    infra: dict[str, str]
    log_dir: Path
    ports: dict[str, int] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ports = {s: free_port() for s in SERVICES}
        self.metrics_ports = {s: free_port() for s in SERVICES}
        self.log_dir.mkdir(parents=True, exist_ok=True)

    @property
    def prefix(self) -> str:
        return f"e2e{self.run_id}."

    def schema_of(self, service: str) -> str:
        """Each service owns its schema, as it owns its database in production."""
        return f"e2e_{self.run_id}_{service}"

    def env(self, service: str) -> dict[str, str]:
        env = development_env(os.environ)  # the tests sign tokens with the development keys
        env.update(self.infra)
        env.update(
            {
                # Tests register many players from one address.
                "NIUNIU_WALLET_THROTTLE": "address_attempts=100000/60,address_failures=100000/60",
                "NIUNIU_TOPIC_PREFIX": self.prefix,
                "NIUNIU_DB_SCHEMA": self.schema_of(service),
                f"NIUNIU_{service.upper()}_DSN": self.infra["DATABASE_URL"],
                f"NIUNIU_{service.upper()}_GRPC_PORT": str(self.ports[service]),
                f"NIUNIU_{service.upper()}_METRICS_PORT": str(self.metrics_ports[service]),
                "NIUNIU_RNG_ADDR": self.addr("rng"),
                "NIUNIU_WALLET_ADDR": self.addr("wallet"),
                "NIUNIU_TABLE_ADDR": self.addr("table"),
                "NIUNIU_LEDGER_ADDR": self.addr("ledger"),
            }
        )
        return env

    def addr(self, service: str) -> str:
        return f"127.0.0.1:{self.ports[service]}"

    def start(self, service: str) -> None:
        log = (self.log_dir / f"{service}.log").open("ab")
        self.procs[service] = subprocess.Popen(
            [str(BIN / f"niuniu-{service}")], env=self.env(service), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
        )
        self.wait_healthy(service)

    def wait_healthy(self, service: str) -> None:
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            proc = self.procs[service]
            if proc.poll() is not None:
                raise RuntimeError(f"{service} exited with {proc.returncode}; see {self.log_dir / service}.log")
            if check(self.addr(service)) == "SERVING":
                return
            time.sleep(0.2)
        raise RuntimeError(f"{service} did not become healthy; see {self.log_dir / service}.log")

    def start_all(self) -> None:
        for service in SERVICES:
            self.start(service)

    def kill(self, service: str) -> None:
        proc = self.procs.pop(service)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        """SIGTERM (graceful: health NOT_SERVING, then stop), SIGKILL whatever is still alive after 15 s."""
        procs = list(self.procs.values())
        self.procs.clear()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


@contextlib.contextmanager
def running_stack(infra: dict[str, str], run_id: str) -> Iterator[Stack]:
    """The four services started for the block, stopped after it."""
    system = Stack(run_id, infra, ROOT / ".run" / "e2e" / run_id)
    try:
        system.start_all()
        yield system
    finally:
        system.stop_all()


def start_gateway(stack: Stack, name: str = "gateway", **settings: str) -> tuple[subprocess.Popen[bytes], str]:
    """A browser gateway process in front of the stack's table and wallet; returns it and its base URL
    (https when ``NIUNIU_GATEWAY_TLS_CERT_FILE`` is among ``settings``). Its /metrics is on a free
    port unless ``NIUNIU_GATEWAY_METRICS_PORT`` is among ``settings``."""
    port = free_port()
    env = stack.env("table")  # the development keys and the services' addresses (NIUNIU_TABLE_ADDR, ...)
    env.update({"NIUNIU_GATEWAY_PORT": str(port), "NIUNIU_GATEWAY_METRICS_PORT": str(free_port()), **settings})
    log = (stack.log_dir / f"{name}.log").open("ab")
    proc = subprocess.Popen([str(BIN / "niuniu-gateway")], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"{'https' if env.get('NIUNIU_GATEWAY_TLS_CERT_FILE') else 'http'}://127.0.0.1:{port}"
    if not http_ready(url + "/healthz", 30.0):
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
