"""A whole system of its own for fault injection: infrastructure and services that may be broken.

``ChaosInfra`` starts a Kafka, a PostgreSQL and a Redis of their own with ``scripts/infra``
(``NIUNIU_RUN_DIR`` and free ports), so they can be killed and restarted without touching
anybody else's. Kafka is moved behind a ``FaultProxy``: the broker listens on a hidden port
and advertises the proxy's, so every client (bootstrap and every later connection) goes
through the proxy and a cut of that link is a real cut.

``ServiceSet`` runs two replicas of each of the four services as processes (as
``tests/e2e/stack.py`` does), all of them active, under libfaketime (their clock can be moved
forward), each reaching PostgreSQL, Redis and every replica of the services it calls through a
``FaultProxy`` of its own, so one service's link can be slowed or cut. Each replica sits in a
slot with a front proxy of its own, and everybody reaches a service by every slot's front
(``ipv4:<front>,<front>``: the channels' round robin spreads the calls); a replica that takes
another's place (``retire``) takes its slot, and the slot's front follows it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from backbone.auth import development_env
from backbone.healthcheck import check
from backbone.kafka import TopicSpec, default_principal_env, ensure_topics, make_admin
from backbone.localports import free_port
from backbone.topics import Topics
from tools.chaos.proxy import FaultProxy

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SERVICES = ("rng", "wallet", "ledger", "table")
REPLICAS = 2
"""Replicas of each service, every one of them active."""
HEALTH_TIMEOUT_S = 90.0
INFRA_TIMEOUT_S = 600.0
KAFKA_TIMEOUT_S = 300.0
"""How long the harness waits for a restarted broker. Its own start took 35-134 s in the long run
of 1 December 2026 (2 cores, the services busy): at 120 s the harness once gave up on a broker
that came back (play resumed 159 s after the restart), and counted its own timeout as a fault not
survived. Whether the system survives is judged from the broker's return (``RECOVERY_S``)."""
SERVICE_NICENESS = 5
"""The services run at a lower CPU priority than the infrastructure and the bots: on a machine of
a few cores the four services under test can keep every core busy, and a restarted broker's JVM
then took over two minutes to start (where it is given cores of its own, as in a deployment, it
takes seconds). Only relative priority changes: whatever the infrastructure leaves is theirs."""


def _libfaketime() -> Path:
    """The libfaketime build shipped in the ``libfaketime`` wheel (a dev dependency).

    Debian bookworm's 0.9.10 cannot leave the monotonic clock alone: with
    FAKETIME_DONT_FAKE_MONOTONIC it hands Python 3.11's ``time.sleep`` a negative deadline
    (EINVAL, wolfcw/libfaketime#426), so every loop that sleeps between retries spins; with the
    monotonic clock faked, every timed lock wait lasts the offset too. The wheel's newer build
    has the fix.
    """
    spec = importlib.util.find_spec("libfaketime")
    for base in spec.submodule_search_locations or () if spec else ():
        lib = Path(base) / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"
        if lib.exists():
            return lib
    return Path("/nonexistent")


LIBFAKETIME = _libfaketime()
# Which other services each service calls (its NIUNIU_<S>_ADDR goes through proxies of its own, one a slot).
CALLS = {"table": ("rng", "wallet"), "ledger": ("table", "wallet"), "wallet": (), "rng": ()}


def read_env_file(path: Path) -> dict[str, str]:
    """The ``export K=V`` lines of ``scripts/infra``'s env file."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^export ([A-Z_][A-Z0-9_]*)=(.*)$", line.strip())
        if m:
            env[m.group(1)] = m.group(2)
    return env


def with_port(url: str, port: int) -> str:
    """``url`` with its port replaced (host stays 127.0.0.1)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    hostport = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{hostport}" if len(netloc) == 2 else hostport))


def url_port(url: str) -> int:
    port = urlsplit(url).port
    if port is None:
        raise ValueError(f"no port in {url.split('@')[-1]}")
    return port


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        time.sleep(0.1)
    return False


WORK_SERIES = {
    "grpc_server_handled_total": "calls",
    "niuniu_outbox_published_total": "published",
    "niuniu_consumer_events_applied_total": "applied",
}


def scrape_work(metrics_port: int) -> Counter[str]:
    """A replica's ``WORK_SERIES`` counters now (gRPC's own health and reflection calls left out)."""
    counts: Counter[str] = Counter()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=3) as response:
            text = response.read().decode()
    except OSError:
        return counts
    for line in text.splitlines():
        kind = WORK_SERIES.get(line.split("{", 1)[0])
        if kind is not None and 'grpc_service="grpc.' not in line:
            counts[kind] += int(float(line.rsplit(" ", 1)[1]))
    return counts


def _proc_cmdline(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def _proc_environ(pid: int) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if b"=" in item:
            k, v = item.decode(errors="replace").split("=", 1)
            env[k] = v
    return env


class ChaosInfra:
    """Kafka, PostgreSQL and Redis of this run only (``scripts/infra`` in ``run_dir``, free ports)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir.resolve()
        self.kafka_port = free_port()
        self.kafka_hidden_port = free_port()
        self.controller_port = free_port()
        self.pg_port = free_port()
        self.redis_port = free_port()
        self.env: dict[str, str] = {}
        self.kafka_proxy: FaultProxy | None = None
        self._kafka_cmd: list[str] = []
        self._kafka_env: dict[str, str] = {}
        self._kafka_proc: subprocess.Popen[bytes] | None = None
        self._redis_cmd: list[str] = []

    # -- scripts/infra ----------------------------------------------------------------------------

    def script_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NIUNIU_") and not k.startswith("KAFKA_")}
        env.update(
            {
                "NIUNIU_RUN_DIR": str(self.run_dir),
                "NIUNIU_KAFKA_PORT": str(self.kafka_port),
                "NIUNIU_KAFKA_CONTROLLER_PORT": str(self.controller_port),
                "NIUNIU_PG_PORT": str(self.pg_port),
                "NIUNIU_REDIS_PORT": str(self.redis_port),
                "NIUNIU_INFRA_LOCK": str(self.run_dir / "infra.lock"),  # ports of our own: no machine-wide lock
                "NIUNIU_KAFKA_HEAP": os.environ.get("NIUNIU_CHAOS_KAFKA_HEAP", "512m"),
            }
        )
        return env

    def _infra(self, *args: str) -> None:
        # Only ever with our own run dir: never the shared infrastructure of the checkout.
        env = self.script_env()
        assert env["NIUNIU_RUN_DIR"] == str(self.run_dir) and self.run_dir != (ROOT / ".run").resolve()
        log = (self.run_dir / "infra.log").open("ab")
        subprocess.run(
            [str(ROOT / "scripts" / "infra"), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=INFRA_TIMEOUT_S,
            cwd=ROOT,
        )

    def up(self) -> dict[str, str]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.run_dir, 0o755)  # the postgres OS user must reach its cluster here
        self._infra("up")
        self.env = read_env_file(self.run_dir / "env")
        os.environ.update(default_principal_env(self.env))  # this process authenticates as the tests' principal
        self._kafka_behind_proxy()
        rdir = self.run_dir / "redis"
        # As scripts/infra starts it (redis-server rewrites its own command line, so it cannot be read back).
        self._redis_cmd = [
            shutil.which("redis-server") or "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.redis_port),
            "--protected-mode",
            "yes",
            "--daemonize",
            "yes",
            "--pidfile",
            str(rdir / "redis.pid"),
            "--logfile",
            str(self.run_dir / "logs" / "redis.log"),
            "--dir",
            str(rdir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--aclfile",
            str(rdir / "users.acl"),
        ]
        return self.env

    def down(self) -> None:
        if self.kafka_proxy is not None:
            self.kafka_proxy.close()
        if self._kafka_proc is not None and self._kafka_proc.poll() is None:
            self._kafka_proc.terminate()
            try:
                self._kafka_proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                self._kafka_proc.kill()
                self._kafka_proc.wait(timeout=10)
        with contextlib.suppress(subprocess.SubprocessError, AssertionError):
            self._infra("down", "--purge")

    # -- Kafka behind a proxy ------------------------------------------------------------------------

    @property
    def kdir(self) -> Path:
        return self.run_dir / "kafka"

    def _kafka_pid(self) -> int:
        return int((self.kdir / "kafka.pid").read_text().strip())

    def _kafka_behind_proxy(self) -> None:
        pid = self._kafka_pid()
        self._kafka_cmd = _proc_cmdline(pid)
        self._kafka_env = _proc_environ(pid)
        os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, 60):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 10)
        conf = self.kdir / "server.properties"
        text = conf.read_text()
        listeners = f"listeners=CLIENT://127.0.0.1:{self.kafka_port},"
        assert listeners in text, f"unexpected Kafka listeners in {conf}"
        conf.write_text(text.replace(listeners, f"listeners=CLIENT://127.0.0.1:{self.kafka_hidden_port},"))
        self.kafka_proxy = FaultProxy("127.0.0.1", self.kafka_hidden_port, listen_port=self.kafka_port)
        self.kafka_proxy.start()
        self.start_kafka()

    def start_kafka(self) -> None:
        log = (self.run_dir / "logs" / "kafka.log").open("ab")
        self._kafka_proc = subprocess.Popen(
            self._kafka_cmd,
            cwd=self.kdir,
            env=self._kafka_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        (self.kdir / "kafka.pid").write_text(f"{self._kafka_proc.pid}\n")  # so `scripts/infra down` finds it
        self.wait_kafka()

    def stop_kafka(self, *, kill: bool = False) -> None:
        proc = self._kafka_proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def wait_kafka(self) -> None:
        deadline = time.monotonic() + KAFKA_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._kafka_proc is not None and self._kafka_proc.poll() is not None:
                code = self._kafka_proc.returncode
                raise RuntimeError(f"Kafka exited with {code}; see {self.run_dir}/logs/kafka.log")
            try:
                admin = make_admin(self.bootstrap, "chaos-health", request_timeout_ms=5_000)
                try:
                    admin.list_topics()
                    return
                finally:
                    admin.close()
            except Exception as error:  # kafka-python raises many kinds while the broker starts
                last = error
                time.sleep(1.0)
        raise RuntimeError(f"Kafka not healthy after {KAFKA_TIMEOUT_S:.0f}s: {last}")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    def create_topics(self, prefix: str) -> None:
        """The run's topics, stamped with the broker's append time: the services' clocks move ahead."""
        specs = [
            TopicSpec(spec.name, spec.partitions, {**spec.config, "message.timestamp.type": "LogAppendTime"})
            for spec in Topics(prefix).specs()
        ]
        ensure_topics(self.bootstrap, specs)

    # -- PostgreSQL -------------------------------------------------------------------------------

    def _pg(self) -> tuple[list[str], Path, Path]:
        """(run-as prefix, pg_ctl, data dir)."""
        home = Path((self.run_dir / "pg.home").read_text().strip())
        data = home / "data"
        pid = int((data / "postmaster.pid").read_text().splitlines()[0]) if (data / "postmaster.pid").exists() else 0
        if pid:
            bindir = Path(os.readlink(f"/proc/{pid}/exe")).parent
            (self.run_dir / "pg.bindir").write_text(str(bindir))
        else:
            bindir = Path((self.run_dir / "pg.bindir").read_text())
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return prefix, bindir / "pg_ctl", data

    def pg_immediate_stop(self) -> None:
        prefix, pg_ctl, data = self._pg()
        subprocess.run(
            [*prefix, str(pg_ctl), "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop"],
            check=True,
            timeout=60,
            capture_output=True,
        )

    def pg_up(self) -> bool:
        prefix, pg_ctl, data = self._pg()
        status = subprocess.run([*prefix, str(pg_ctl), "-D", str(data), "status"], timeout=30, capture_output=True)
        return status.returncode == 0

    def pg_start(self) -> None:
        if self.pg_up():
            return
        prefix, pg_ctl, data = self._pg()
        log = data.parent / "postgres.log"
        subprocess.run(
            [*prefix, str(pg_ctl), "-D", str(data), "-l", str(log), "-w", "-t", "120", "start"],
            check=True,
            timeout=150,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )

    # -- Redis ------------------------------------------------------------------------------------

    def _redis_pid(self) -> int:
        return int((self.run_dir / "redis" / "redis.pid").read_text().strip())

    def redis_kill(self) -> None:
        """SIGKILL: no persistence, so everything it held is gone."""
        pid = self._redis_pid()
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, 10)

    def redis_up(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.redis_port), timeout=1):
            return True
        return False

    def redis_start(self) -> None:
        if self.redis_up():
            return
        subprocess.run(
            self._redis_cmd,
            cwd=self.run_dir / "redis",
            check=True,
            timeout=30,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.redis_up():
                return
            time.sleep(0.1)
        raise RuntimeError("redis did not come back")


@dataclass
class Instance:
    """One service process (a table replica is an instance of its own, with its own ports and proxies)."""

    name: str
    service: str
    port: int
    metrics_port: int
    proxies: dict[str, FaultProxy] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    stopped: bool = False

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ServiceSet:
    """Two replicas of each of the four services as processes, all active; each link through a proxy, clocks
    under libfaketime."""

    def __init__(
        self,
        run_id: str,
        infra: ChaosInfra,
        log_dir: Path,
        *,
        replicas: int = REPLICAS,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.run_id = run_id
        self.infra = infra
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.clock_file = log_dir / "faketime"
        self.clock_file.write_text("+0\n")
        self.clock_offset_s = 0
        self.extra_env = extra_env or {}
        self.instances: dict[str, Instance] = {}
        self.retired: dict[str, Instance] = {}
        self.banked: dict[str, Counter[str]] = {}
        self.slots: dict[str, list[str]] = {}  # service -> the replica in each slot
        self.front: dict[str, list[FaultProxy]] = {}  # service -> each slot's proxy, the others reach it by
        self._made: Counter[str] = Counter()  # replicas made of each service (for their names)
        for service in SERVICES:
            self.front[service] = []
            for _ in range(replicas):
                front = FaultProxy("127.0.0.1", free_port())
                front.start()
                self.front[service].append(front)
        for service in SERVICES:
            self.slots[service] = [self._new_instance(service, port=f.target_port).name for f in self.front[service]]

    @property
    def prefix(self) -> str:
        return f"chaos{self.run_id}."

    def schema_of(self, service: str) -> str:
        return f"chaos_{self.run_id}_{service}"

    def addr(self, service: str) -> str:
        """Where clients reach ``service``: every slot's front (round robin over its replicas)."""
        return "ipv4:" + ",".join(front.address for front in self.front[service])

    def _new_instance(self, service: str, *, port: int | None = None) -> Instance:
        self._made[service] += 1
        name = service if self._made[service] == 1 else f"{service}{self._made[service]}"
        inst = Instance(name, service, port or free_port(), free_port())
        env = self.infra.env
        for dep, target_port in (("pg", url_port(env["DATABASE_URL"])), ("redis", url_port(env["REDIS_URL"]))):
            inst.proxies[dep] = FaultProxy("127.0.0.1", target_port)
        for other in CALLS[service]:
            for slot, front in enumerate(self.front[other], start=1):
                inst.proxies[f"{other}#{slot}"] = FaultProxy("127.0.0.1", front.port)
        for proxy in inst.proxies.values():
            proxy.start()
        self.instances[name] = inst
        return inst

    def env(self, inst: Instance) -> dict[str, str]:
        env = development_env(os.environ)
        env.update(self.infra.env)
        database = with_port(self.infra.env["DATABASE_URL"], inst.proxies["pg"].port)
        env.update(
            {
                "NIUNIU_WALLET_THROTTLE": "address_attempts=100000/60,address_failures=100000/60",
                "NIUNIU_TOPIC_PREFIX": self.prefix,
                "NIUNIU_DB_SCHEMA": self.schema_of(inst.service),
                "DATABASE_URL": database,
                f"NIUNIU_{inst.service.upper()}_DSN": database,
                "REDIS_URL": with_port(self.infra.env["REDIS_URL"], inst.proxies["redis"].port),
                f"NIUNIU_{inst.service.upper()}_GRPC_PORT": str(inst.port),
                f"NIUNIU_{inst.service.upper()}_METRICS_PORT": str(inst.metrics_port),
                "LD_PRELOAD": str(LIBFAKETIME),
                "FAKETIME_TIMESTAMP_FILE": str(self.clock_file),
                "FAKETIME_CACHE_DURATION": "1",
                # Only the wall clock steps forward (as NTP would step it). With the monotonic clock
                # faked too, every timed wait after a step lasted the offset plus its timeout (a relay's
                # producer flush hung for an hour): glibc's sem_clockwait is not intercepted.
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            }
        )
        for other in SERVICES:
            mine = [p.address for dep, p in inst.proxies.items() if dep.split("#")[0] == other]
            env[f"NIUNIU_{other.upper()}_ADDR"] = "ipv4:" + ",".join(mine) if mine else self.addr(other)
        env.update(self.extra_env)
        # A prefixed system: the services' own Kafka ACLs (niuniu.<service>.*) do not cover its topics.
        return default_principal_env(env)

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self, name: str, *, wait: bool = True) -> Instance:
        inst = self.instances[name]
        log = (self.log_dir / f"{name}.log").open("ab")
        inst.proc = subprocess.Popen(
            ["nice", "-n", str(SERVICE_NICENESS), str(BIN / f"niuniu-{inst.service}")],  # nice execs: same pid
            env=self.env(inst),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        inst.stopped = False
        if wait:
            self.wait_healthy(name)
        return inst

    def wait_healthy(self, name: str, timeout_s: float = HEALTH_TIMEOUT_S) -> float:
        """Seconds until the instance said SERVING."""
        inst = self.instances[name]
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if inst.proc is None or inst.proc.poll() is not None:
                code = inst.proc.returncode if inst.proc else None
                raise RuntimeError(f"{name} exited with {code}; see {self.log_dir / name}.log")
            if check(inst.addr) == "SERVING":
                return time.monotonic() - started
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not become healthy in {timeout_s:.0f}s; see {self.log_dir / name}.log")

    def start_all(self) -> None:
        """Every service's first replica side by side (each makes its own schema), then their second ones."""
        self.infra.create_topics(self.prefix)
        for slot in range(len(self.slots[SERVICES[0]])):
            names = [self.slots[service][slot] for service in SERVICES]
            for name in names:
                self.start(name, wait=False)
            for name in names:
                self.wait_healthy(name)

    def kill(self, name: str) -> None:
        inst = self.instances[name]
        if inst.proc is not None and inst.proc.poll() is None:
            if not inst.stopped:
                self._bank(inst)  # its counters die with it
            if inst.stopped:
                inst.proc.send_signal(signal.SIGCONT)
            inst.proc.send_signal(signal.SIGKILL)
            inst.proc.wait(timeout=10)

    def pause(self, name: str) -> None:
        inst = self.instances[name]
        assert inst.proc is not None
        inst.proc.send_signal(signal.SIGSTOP)
        inst.stopped = True

    def resume(self, name: str) -> None:
        inst = self.instances[name]
        assert inst.proc is not None
        inst.proc.send_signal(signal.SIGCONT)
        inst.stopped = False

    def add_replica(self, service: str) -> Instance:
        inst = self._new_instance(service)
        self.start(inst.name)
        return inst

    def retire(self, name: str, successor: str) -> None:
        """A dead replica for good: its proxies close; if it was in a slot, ``successor`` (a replica in no
        slot) takes the slot and the slot's front follows it."""
        self.kill(name)
        inst = self.instances.pop(name)
        self.retired[name] = inst
        for proxy in inst.proxies.values():
            proxy.close()
        slots = self.slots[inst.service]
        if name not in slots:
            return
        slot = slots.index(name)
        slots[slot] = successor
        front = self.front[inst.service][slot]
        front.target_port = self.instances[successor].port
        front.cut()  # clients reconnect, to the new target
        front.restore()

    def slot_of(self, service: str, n: int) -> str:
        """The replica in slot ``n`` (modulo the slots) of ``service``."""
        slots = self.slots[service]
        return slots[n % len(slots)]

    # -- work ---------------------------------------------------------------------------------------

    def _bank(self, inst: Instance) -> None:
        """Add what the instance's counters say so far to what it did before (they restart from zero)."""
        self.banked.setdefault(inst.name, Counter()).update(scrape_work(inst.metrics_port))

    def work(self) -> dict[str, dict[str, float]]:
        """Per replica (retired ones too): calls served, events published, records applied (over every
        restart), and tables taken (its log's ``took table`` lines)."""
        out: dict[str, dict[str, float]] = {}
        for name, inst in {**self.retired, **self.instances}.items():
            counts = Counter(self.banked.get(name, Counter()))
            if inst.alive() and not inst.stopped:
                counts.update(scrape_work(inst.metrics_port))
            log = self.log_dir / f"{name}.log"
            counts["tables"] = log.read_text(errors="replace").count('"took table"') if log.exists() else 0
            out[name] = {kind: float(counts.get(kind, 0)) for kind in ("calls", "published", "applied", "tables")}
        return out

    def replicas(self, service: str) -> list[Instance]:
        return [i for i in self.instances.values() if i.service == service]

    def move_clock(self, seconds: int) -> None:
        self.clock_offset_s += seconds
        self.clock_file.write_text(f"+{self.clock_offset_s}\n")

    def links(self) -> dict[str, FaultProxy]:
        """Every link that can be slowed or cut, by name ("table2->wallet#1", "wallet->pg", "all->kafka")."""
        out = {f"{i.name}->{dep}": p for i in self.instances.values() for dep, p in i.proxies.items()}
        if self.infra.kafka_proxy is not None:
            out["all->kafka"] = self.infra.kafka_proxy
        return out

    def stop_all(self) -> None:
        procs = [i.proc for i in self.instances.values() if i.proc is not None and i.proc.poll() is None]
        for inst in self.instances.values():
            if inst.stopped and inst.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    inst.proc.send_signal(signal.SIGCONT)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for inst in self.instances.values():
            for proxy in inst.proxies.values():
                proxy.close()
        for fronts in self.front.values():
            for front in fronts:
                front.close()
