"""The local overlay's Deployments, run for real: each container command with exactly its rendered environment.

``kubectl kustomize deploy/k8s/overlays/local`` is rendered; its Jobs (``niuniu-migrate`` per
database) run to completion first, as a release runs them; then for every Deployment the
environment its container would get is resolved (``env`` values and ``valueFrom``
references, ``envFrom`` ConfigMaps and Secrets) and its ``command`` started as a
process with that environment and nothing else; it counts as started when its
``readinessProbe`` (gRPC health or an HTTP GET) answers at its local port. Only what
names the cluster is mapped to this machine:

- a Service of the overlay's own workloads (``rng:50051``) -> ``127.0.0.1:<free port>``
  of the Deployment the Service selects, and each container port a Deployment's
  variables name (``NIUNIU_TABLE_GRPC_PORT=50052``) -> that free port (the pods share
  one loopback here);
- the infrastructure Services (``kafka``, ``postgres``, ``redis``) -> the local stack of
  scripts/infra, with its credentials in place of the overlay's development ones (the
  secret manager's job in a cluster): each service its own database role and Kafka
  principal, as the manifests say.

The variable names are exactly the rendered ones (checked). The system then plays a
Golden Bull round through the four processes and the ledger journals it. It runs on
the system's own topics (``niuniu.*``, NIUNIU_TOPIC_PREFIX is empty in the overlay) and
the service databases' default schemas: the same system ``scripts/up`` runs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest
from niuniu.ledger.v1 import ledger_pb2
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from ops_support import ROOT, render

from backbone.healthcheck import check

E2E = ROOT / "tests" / "e2e"
if str(E2E) not in sys.path:
    sys.path.insert(0, str(E2E))  # the end-to-end clients and helpers, imported by their bare names

from play import Watcher, connect, kind, ledger_matches_wallet, settle_everything, update_is  # noqa: E402
from players import register  # noqa: E402
from stack import free_port  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OVERLAY = "overlays/local"
BIN = Path(sys.executable).parent
START_ORDER = ("rng", "wallet", "ledger", "table")
INFRA = ("kafka", "postgres", "redis")
HEALTH_TIMEOUT_S = 90.0
WAIT_S = 120.0
FAST = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=5_000,
    chips_minor=[100],
    betting_seconds=2,
    reveal_interval_ms=10,
    pause_between_rounds_ms=50,
)


# --- the rendered environment ----------------------------------------------------------------------------


def _named(docs: list[dict[str, Any]], kind_: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d.get("kind") == kind_ and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind_}/{name}: {len(found)} in the rendered overlay"
    return found[0]


def _data(doc: dict[str, Any]) -> dict[str, str]:
    """A ConfigMap's or Secret's keys and values (a Secret's ``data`` decoded)."""
    values = {k: str(v) for k, v in (doc.get("data") or {}).items()}
    if doc["kind"] == "Secret":
        values = {k: base64.b64decode(v).decode() for k, v in values.items()}
    values.update({k: str(v) for k, v in (doc.get("stringData") or {}).items()})
    return values


def container_env(container: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, str]:
    """What the kubelet would put in the container's environment (``env`` wins over ``envFrom``)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        ref_kind = "ConfigMap" if "configMapRef" in source else "Secret"
        ref = source.get("configMapRef") or source["secretRef"]
        prefix = source.get("prefix", "")
        env.update({prefix + k: v for k, v in _data(_named(docs, ref_kind, ref["name"])).items()})
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        ref = item.get("valueFrom", {})
        if "configMapKeyRef" in ref or "secretKeyRef" in ref:
            ref_kind = "ConfigMap" if "configMapKeyRef" in ref else "Secret"
            key_ref = ref.get("configMapKeyRef") or ref["secretKeyRef"]
            env[item["name"]] = _data(_named(docs, ref_kind, key_ref["name"]))[key_ref["key"]]
        else:
            raise AssertionError(f"{item['name']}: valueFrom {sorted(ref)} is not resolvable outside a cluster")
    return env


# --- cluster names -> this machine -----------------------------------------------------------------------


@dataclass
class Workload:
    name: str
    service: str  # rng, table, ...: from the command niuniu-<service>
    command: list[str]
    labels: dict[str, str]
    container_ports: dict[str, int]  # name -> port
    env: dict[str, str]
    probe: dict[str, Any]  # the readinessProbe
    local_ports: dict[int, int] = field(default_factory=dict)  # container port -> free local port


@dataclass
class Mapping:
    """How each cluster address and credential of the overlay is found on this machine."""

    local_env: dict[str, str]
    workloads: dict[str, Workload]
    services: dict[str, dict[str, Any]]  # Service name -> its document
    jobs: dict[str, Workload] = field(default_factory=dict)  # the release's Jobs (niuniu-migrate), run first
    changes: list[str] = field(default_factory=list)

    def _workload_of(self, service_name: str) -> Workload | None:
        selector = self.services[service_name]["spec"].get("selector") or {}
        for workload in self.workloads.values():
            if selector and all(workload.labels.get(k) == v for k, v in selector.items()):
                return workload
        return None

    def address(self, host: str, port: int) -> str:
        """``host:port`` of a cluster Service as reachable here."""
        if host in INFRA:
            return self._infra(host)
        workload = self._workload_of(host)
        assert workload is not None, f"Service {host} selects no Deployment of the overlay"
        (spec_port,) = [p for p in self.services[host]["spec"]["ports"] if int(p["port"]) == port]
        target = spec_port.get("targetPort", port)
        container_port = workload.container_ports[target] if isinstance(target, str) else int(target)
        return f"127.0.0.1:{workload.local_ports[container_port]}"

    def _infra(self, host: str) -> str:
        if host == "kafka":
            return self.local_env["KAFKA_BOOTSTRAP_SERVERS"]
        url = urlsplit(self.local_env["REDIS_URL"] if host == "redis" else self.local_env["DATABASE_URL"])
        return f"{url.hostname}:{url.port}"

    def localize(self, workload: Workload) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, value in workload.env.items():
            new = self._localize_one(workload, name, value)
            if new != value:
                self.changes.append(f"{workload.name}: {name}")
            out[name] = new
        assert set(out) == set(workload.env)
        return out

    def _localize_one(self, workload: Workload, name: str, value: str) -> str:
        local = self.local_env
        dsn = re.fullmatch(r"NIUNIU_([A-Z]+)_DSN", name)
        if dsn:  # the service's own database and role, with the local stack's password
            theirs, mine = urlsplit(value), urlsplit(local[name])
            assert theirs.hostname == "postgres" and theirs.path == mine.path, (name, theirs.path, mine.path)
            return local[name]
        if re.fullmatch(r"NIUNIU_[A-Z]+_KAFKA_USER", name):  # the local broker spells niuniu-rng as niuniu_rng
            assert value.replace("-", "_") == local[name], (name, value, local[name])
            return local[name]
        if re.fullmatch(r"NIUNIU_[A-Z]+_KAFKA_PASSWORD", name):
            return local[name]
        if name == "REDIS_URL":
            assert urlsplit(value).hostname == "redis" and urlsplit(value).username == urlsplit(local[name]).username
            return local[name]
        if name == "REDIS_PASSWORD":
            return urlsplit(local["REDIS_URL"]).password or ""
        if name.endswith("_PORT") and value.isdigit() and int(value) in workload.local_ports:
            return str(workload.local_ports[int(value)])
        return re.sub(
            r"(?<![\w.-])([a-z][a-z0-9-]*):(\d+)\b",
            lambda m: self.address(m.group(1), int(m.group(2))) if m.group(1) in self.services else m.group(0),
            value,
        )


def _workload(doc: dict[str, Any], docs: list[dict[str, Any]]) -> Workload:
    pod = doc["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    command = list(container["command"]) + list(container.get("args") or [])
    ports = {p.get("name", str(p["containerPort"])): int(p["containerPort"]) for p in container.get("ports", [])}
    return Workload(
        doc["metadata"]["name"],
        command[0].removeprefix("niuniu-"),
        command,
        dict(pod["metadata"].get("labels") or {}),
        ports,
        container_env(container, docs),
        dict(container.get("readinessProbe") or {}),
        {port: free_port() for port in ports.values()},
    )


def mapping(docs: list[dict[str, Any]], local_env: dict[str, str]) -> Mapping:
    workloads = {d["metadata"]["name"]: _workload(d, docs) for d in docs if d.get("kind") == "Deployment"}
    jobs = {d["metadata"]["name"]: _workload(d, docs) for d in docs if d.get("kind") == "Job"}
    services = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Service"}
    return Mapping(local_env, workloads, services, jobs=jobs)


# --- the run ---------------------------------------------------------------------------------------------


@dataclass
class Running:
    mapping: Mapping
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def addr(self, service: str) -> str:
        (workload,) = [w for w in self.mapping.workloads.values() if w.service == service]
        return f"127.0.0.1:{workload.local_ports[workload.container_ports['grpc']]}"

    def complete(self, job: Workload) -> None:
        """Run a Job's container to completion, as the release does before its Deployments roll."""
        log_path = self.log_dir / f"{job.name}.log"
        with log_path.open("ab") as log:
            done = subprocess.run(
                [str(BIN / job.command[0]), *job.command[1:]],
                env=self.mapping.localize(job),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.log_dir,
                timeout=HEALTH_TIMEOUT_S,
                check=False,
            )
        assert done.returncode == 0, f"{job.name} failed:\n{log_path.read_text(errors='replace')[-3000:]}"

    def start(self, workload: Workload) -> None:
        env = self.mapping.localize(workload)
        executable = BIN / workload.command[0]
        assert executable.exists(), f"{workload.name}: command {workload.command[0]} is not installed in the venv"
        log_path = self.log_dir / f"{workload.name}.log"
        self.procs[workload.name] = subprocess.Popen(
            [str(executable), *workload.command[1:]],
            env=env,
            stdout=log_path.open("ab"),
            stderr=subprocess.STDOUT,
            cwd=self.log_dir,
        )
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while not self.ready(workload):
            proc = self.procs[workload.name]
            log_tail = log_path.read_text(errors="replace")[-3000:]
            assert proc.poll() is None, f"{workload.name} exited with {proc.returncode}:\n{log_tail}"
            assert time.monotonic() < deadline, f"{workload.name} never ready:\n{log_tail}"
            time.sleep(0.3)

    def ready(self, workload: Workload) -> bool:
        """The container's readinessProbe (grpc or httpGet), asked at its local port."""
        probe = workload.probe

        def port_of(value: int | str) -> int:
            return workload.local_ports[workload.container_ports[value] if isinstance(value, str) else int(value)]

        if "grpc" in probe:
            return check(f"127.0.0.1:{port_of(probe['grpc']['port'])}") == "SERVING"
        if "httpGet" in probe:
            url = f"http://127.0.0.1:{port_of(probe['httpGet']['port'])}{probe['httpGet'].get('path', '/')}"
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    return 200 <= int(reply.status) < 400
            except OSError:
                return False
        raise AssertionError(f"{workload.name}: readiness probe {sorted(probe)} not supported here")

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.procs.clear()


def local_stack_env() -> dict[str, str]:
    """The local stack's addresses and credentials (scripts/infra writes them to .run/env)."""
    env: dict[str, str] = {}
    env_file = ROOT / ".run" / "env"
    if env_file.exists():
        for line in env_file.read_text().splitlines():
            if line.startswith("export ") and "=" in line:
                key, _, value = line.removeprefix("export ").partition("=")
                env[key] = value.strip("'\"")
    needed = ["KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL", "REDIS_URL"]
    needed += [f"NIUNIU_{s.upper()}_{what}" for s in START_ORDER for what in ("DSN", "KAFKA_USER", "KAFKA_PASSWORD")]
    missing = [k for k in needed if not env.get(k)]
    if missing:
        pytest.skip(f"no local stack credentials ({', '.join(missing)}): run scripts/infra up")
    return env


@pytest.fixture(scope="module")
def running(infra: dict[str, str]) -> Iterator[Running]:
    docs = render(OVERLAY)
    system = Running(mapping(docs, local_stack_env()), ROOT / ".run" / "k8s-run" / uuid.uuid4().hex[:8])
    system.log_dir.mkdir(parents=True, exist_ok=True)
    by_service = {w.service: w for w in system.mapping.workloads.values()}
    assert set(START_ORDER) <= set(by_service), sorted(by_service)
    assert {j.service for j in system.mapping.jobs.values()} >= {"migrate"}, sorted(system.mapping.jobs)
    try:
        for job in system.mapping.jobs.values():
            system.complete(job)
        for service in [*START_ORDER, *sorted(set(by_service) - set(START_ORDER))]:
            system.start(by_service[service])
        yield system
    finally:
        system.stop()


def test_the_mapping_changes_only_cluster_names_and_credentials() -> None:
    docs = render(OVERLAY)
    m = mapping(docs, local_stack_env())
    table = m.workloads["niuniu-table"]
    env = m.localize(table)
    rng, wallet = m.workloads["niuniu-rng"], m.workloads["niuniu-wallet"]
    assert env["NIUNIU_RNG_ADDR"] == f"127.0.0.1:{rng.local_ports[rng.container_ports['grpc']]}"
    assert env["NIUNIU_WALLET_ADDR"] == f"127.0.0.1:{wallet.local_ports[wallet.container_ports['grpc']]}"
    assert env["NIUNIU_TABLE_GRPC_PORT"] == str(table.local_ports[table.container_ports["grpc"]])
    # Settings that name nothing of the cluster pass through unchanged.
    unchanged = {k: v for k, v in table.env.items() if env[k] == v}
    assert unchanged["NIUNIU_ENV"] == "development" and "NIUNIU_TOPIC_PREFIX" in unchanged
    # A variable the overlay does not set is not made up here.
    del table.env["NIUNIU_WALLET_ADDR"]
    assert "NIUNIU_WALLET_ADDR" not in m.localize(table)


async def test_the_rendered_deployments_play_a_round(running: Running) -> None:
    run = uuid.uuid4().hex[:8]
    table_id = f"k8s-{run}"
    async with connect(running) as c:  # type: ignore[arg-type]  # anything with addr(service)
        players = [await register(c, f"k8s{i}x{run}", 100_000) for i in range(2)]
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=FAST), metadata=c.admin
        )
        watcher = Watcher(c, players[0], table_id)
        try:
            opened = await watcher.wait_for(lambda u: kind(u) == "round_opened")
            for n, p in enumerate(players):
                await c.table.PlaceBet(
                    table_pb2.PlaceBetRequest(
                        command_id=f"k8s-{run}-{n}",
                        table_id=table_id,
                        area=f"area_{n + 1}",
                        amount_minor=500,
                        round_id=opened.round_id,
                    ),
                    metadata=p.auth,
                )
            await watcher.wait_for(update_is("result", opened.round_id))
            await settle_everything(c, players)
            # The ledger journaled the round from Kafka (its own principal and database).
            deadline = time.monotonic() + WAIT_S
            while True:
                journal = await c.ledger.RoundJournal(
                    ledger_pb2.RoundJournalRequest(round_id=opened.round_id), metadata=c.auditor
                )
                if journal.status == "settled" and journal.entries:
                    break
                assert time.monotonic() < deadline, f"the ledger never journaled {opened.round_id}: {journal}"
                await asyncio.sleep(0.5)
            await ledger_matches_wallet(c)
        finally:
            await watcher.stop()
            with contextlib.suppress(grpc.aio.AioRpcError):  # the system keeps no table of this test's
                await c.table.CloseTable(table_pb2.CloseTableRequest(table_id=table_id), metadata=c.admin)
