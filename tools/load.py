"""``niuniu-load``: bets against the running system, with the database's own rate beside the figures.

    niuniu-load [--tables 12] [--variants golden_bull] [--players 400] [--in-flight 64]
                [--bets-per-call 1] [--rate 0] [--warmup 10] [--duration 40] [--runs 1] [--profile DIR]
                [--table HOST:PORT --wallet HOST:PORT --metrics URL,...]

Without ``--table`` it starts the four services itself (``niuniu-rng``, ``-wallet``,
``-ledger``, ``-table`` as separate processes on the development keys, each with a
schema and topic prefix of its own run, on loopback ports), like the end-to-end tests.
It creates ``--tables`` tables of the ``--variants`` (cycled), registers and funds
``--players`` players, and one more player for each table that needs a house seat: the
banker of a baibian_bull table (its whole balance as capital), the dealer of a
red_envelope_bull table (the table's minimum bid in every round's bidding window).

It bets for ``--warmup`` seconds first, uncounted, and then, with the services it started,
has PostgreSQL ANALYZE the run's tables: a running system's tables have statistics (autovacuum
analyzes a table as it grows, a minute apart by default), but the run's are new, and the plans
its services cache in their first seconds would otherwise be made for empty tables and kept
while the tables grow (which plan a statement keeps depending on when autovacuum happened by).
Then for ``--duration`` seconds it keeps ``--in-flight`` PlaceBet
calls outstanding (``--rate`` > 0: at most that many calls a second) on tables that
are taking bets; ``--bets-per-call`` N > 1 sends PlaceBets calls of N bets of one player
at one table instead (chips on several areas at once). Each run prints accepted bets/s
(and by variant, with more than one), the calls' latency percentiles, the
refusals by status and reason, the outbox backlog and consumer lag read from the
services' /metrics, the seconds from each round's settlement to the wallet's last
movement for it (and to the wallet's settlement event on Kafka, in ``SETTLEMENT_STAGES``: where
that time went), the CPU of the services, of PostgreSQL and of Kafka (cores, and
milliseconds per accepted bet beside the whole machine's: where a bet's cost goes), and,
measured right after the run, PostgreSQL's one-row INSERT commit rate on 16 connections
and the table process's rate of empty calls (gRPC health ``Check`` through the same server
and interceptors, as many in flight): every figure reads as a ratio of what the database
and the gRPC stack underneath do on the same machine at that moment.

``--profile DIR`` records every service with py-spy during each run (raw folded stacks,
DIR/<service>-run<N>.txt). ``--audit`` (with the services it started) runs ``niuniu-audit
replay`` after the last run, against the run's journal, topics and wallet, prints its
verdict and exits non-zero unless it is clean. Only loopback addresses are accepted.

A takeover under load (a replica of each service SIGKILLed in turn) is ``python -m tools.takeover``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from niuniu.table.v1 import events_pb2 as table_events
from niuniu.table.v1 import table_pb2, table_pb2_grpc
from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc
from psycopg import sql

from backbone import tls
from backbone.auth import Role, Tokens, bearer, development_env
from backbone.config import DEFAULT_KAFKA, DEFAULT_REDIS
from backbone.cpuquota import CPU_ROOT, CpuGroups, unavailable_reason
from backbone.healthcheck import check
from backbone.kafka import default_principal_env, ensure_topics, make_admin
from backbone.limits import Limit, pgbench_commits
from backbone.localports import free_port
from backbone.topics import Topics
from bull.variants import VARIANTS, RoundShape
from bull.variants.red_envelope_bull import BID_MIN, DEFAULT_BID_MIN_MINOR
from services.table.bets import MAX_BETS_PER_CALL
from services.table.runner import lease_name

SERVICES = ("rng", "wallet", "ledger", "table")
HEALTH_TIMEOUT_S = 90.0
DEPOSIT_MINOR = 10_000_000_000
BID_TIMEOUT_S = 10.0
STAKE_MINOR = 100
LIMITS = table_events.TableLimits(
    min_bet_minor=100,
    max_bet_minor=1_000_000_000,
    chips_minor=[100],
    betting_seconds=10,
    reveal_interval_ms=100,
    pause_between_rounds_ms=300,
)
TABLE_POLL_S = 0.2
CLOSING_MARGIN_MS = 150  # no bet in a window's last moments: it would race the close
DRAIN_TIMEOUT_S = 60.0
SETUP_CONCURRENCY = 8
SETUP_ATTEMPTS = 5
SETUP_RETRY_S = 0.5
"""Setup calls refused UNAVAILABLE (e.g. a lock wait that ran out on a crowded machine) are retried
with the same request id, a little later each time."""
MAX_DURATION_S = 3_600
MAX_IN_FLIGHT = 1_024
MAX_PLAYERS = 10_000
MAX_TABLES = 500
LOOPBACK = ("127.", "localhost", "[::1]")
EMPTY_CALL_S = 5.0
"""How long the empty-call rate is measured after each run."""
MAX_REPLICAS = 8
REPLICA_POOL_SIZE = 8
"""PostgreSQL connections each replica's pool may hold with ``--replicas`` (at every N alike): 8 replicas of
four services at the default 20 would ask for more than the shared server's ``max_connections``."""
QUOTA_PARENT = "niuniu-load"
"""The CPU cgroup under which ``--cpu-per-replica`` makes each replica's group (``<run>-<service>-<i>``)."""


def _loopback(addr: str) -> str:
    host = addr.split("://", 1)[-1]
    if not host.startswith(LOOPBACK):
        raise SystemExit(f"niuniu-load: only loopback targets are allowed, not {addr!r}")
    return addr


@dataclass
class LocalStack:
    """The four services as processes of this run (killed on exit), ``replicas`` of each.

    With more than one replica of a service, each has ports of its own, and the others (and the load)
    reach the service as ``ipv4:<addr>,<addr>,...``: the channels' round robin spreads the calls.
    """

    run_id: str
    log_dir: Path
    replicas: int = 1
    counts: dict[str, int] = field(default_factory=dict)
    """Services run with another number of replicas than ``replicas`` (``python -m tools.takeover``: one rng)."""
    ports: dict[str, list[int]] = field(default_factory=dict)
    metrics_ports: dict[str, list[int]] = field(default_factory=dict)
    procs: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ports = {s: [free_port() for _ in range(self.count(s))] for s in SERVICES}
        self.metrics_ports = {s: [free_port() for _ in range(self.count(s))] for s in SERVICES}
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def count(self, service: str) -> int:
        """How many replicas of ``service`` run."""
        return self.counts.get(service, self.replicas)

    def schema(self, service: str) -> str:
        return f"load_{self.run_id}_{service}"

    @property
    def topic_prefix(self) -> str:
        return f"load{self.run_id}."

    def addr(self, service: str) -> str:
        """The service's address for a channel: its one replica's, or every replica's (round robin)."""
        ports = self.ports[service]
        if len(ports) == 1:
            return f"127.0.0.1:{ports[0]}"
        return "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)

    def replica_names(self, service: str) -> list[str]:
        """``service`` alone, or ``service-1`` .. ``service-N``."""
        n = self.count(service)
        return [service] if n == 1 else [f"{service}-{i}" for i in range(1, n + 1)]

    def metrics_urls(self, service: str | None = None) -> list[str]:
        services = SERVICES if service is None else (service,)
        return [f"http://127.0.0.1:{port}/metrics" for s in services for port in self.metrics_ports[s]]

    def env(self, service: str, replica: int = 0) -> dict[str, str]:
        env = default_principal_env(development_env(os.environ))  # prefixed topics: the default Kafka principal
        env.update(
            {
                "NIUNIU_WALLET_THROTTLE": "address_attempts=1000000/60,address_failures=1000000/60",
                "NIUNIU_TOPIC_PREFIX": self.topic_prefix,
                "NIUNIU_DB_SCHEMA": self.schema(service),
                f"NIUNIU_{service.upper()}_DSN": os.environ["DATABASE_URL"],
                f"NIUNIU_{service.upper()}_GRPC_PORT": str(self.ports[service][replica]),
                f"NIUNIU_{service.upper()}_METRICS_PORT": str(self.metrics_ports[service][replica]),
                "NIUNIU_LOG_LEVEL": "WARNING",
                **{f"NIUNIU_{s.upper()}_ADDR": self.addr(s) for s in SERVICES},
            }
        )
        if max(self.count(s) for s in SERVICES) > 1:
            env["NIUNIU_DB_POOL_MAX_SIZE"] = str(REPLICA_POOL_SIZE)
        return env

    def start(self) -> None:
        """The run's topics, then every service's first replica, then their others, each group side by side
        (a first replica makes its service's schema alone; the services' schemas are their own). With every
        topic there from the start, each relay and consumer knows its topics' partitions at once instead of
        at its next metadata refresh, up to 30 s later, inside the runs."""
        ensure_topics(os.environ.get("KAFKA_BOOTSTRAP_SERVERS", DEFAULT_KAFKA), Topics(self.topic_prefix).specs())
        for service in SERVICES:
            self.procs[service] = [self._spawn(service, 0)]
        for service in SERVICES:
            self._wait_serving(service, [0])
        for service in SERVICES:
            self.procs[service] += [self._spawn(service, i) for i in range(1, self.count(service))]
        for service in SERVICES:
            self._wait_serving(service, list(range(1, self.count(service))))

    def _spawn(self, service: str, replica: int) -> subprocess.Popen[bytes]:
        name = self.replica_names(service)[replica]
        log = (self.log_dir / f"{name}.log").open("ab")
        binary = Path(sys.executable).parent / f"niuniu-{service}"
        return subprocess.Popen([str(binary)], env=self.env(service, replica), stdout=log, stderr=subprocess.STDOUT)

    def _wait_serving(self, service: str, replicas: list[int]) -> None:
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        for i in replicas:
            while check(f"127.0.0.1:{self.ports[service][i]}") != "SERVING":
                if self.procs[service][i].poll() is not None or time.monotonic() > deadline:
                    name = self.replica_names(service)[i]
                    raise SystemExit(f"niuniu-load: {name} did not start; see {self.log_dir / name}.log")
                time.sleep(0.2)

    def stop(self) -> None:
        procs = [proc for replicas in self.procs.values() for proc in replicas]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def replica_pids(self) -> dict[int, str]:
        """Each replica's process id -> its name."""
        return {
            proc.pid: name
            for service, procs in self.procs.items()
            for proc, name in zip(procs, self.replica_names(service), strict=True)
        }

    def cpu_seconds(self) -> dict[str, float]:
        ticks = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for service, procs in self.procs.items():
            for proc in procs:
                stat = _proc_stat(str(proc.pid))
                if stat is not None:
                    out[service] = out.get(service, 0.0) + (int(stat[1][11]) + int(stat[1][12])) / ticks
        return out

    async def analyze(self) -> int:
        """ANALYZE every table of the run's schemas (as autovacuum does to a running system's); how many."""
        async with await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT schemaname, tablename FROM pg_tables WHERE schemaname = ANY(%s) ORDER BY 1, 2",
                ([self.schema(s) for s in SERVICES],),
            )
            tables = await cur.fetchall()
            for schema, name in tables:
                await conn.execute(sql.SQL("ANALYZE {}.{}").format(sql.Identifier(schema), sql.Identifier(name)))
        return len(tables)

    async def drop(self) -> None:
        """The run's schemas and topics (left on a long-lived broker, thousands of partitions slow its start)."""
        async with await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            for service in SERVICES:
                await conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema(service)))
                )
        await asyncio.to_thread(self._delete_topics)

    def _delete_topics(self) -> None:
        admin = make_admin(os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"), "niuniu-load")
        try:
            mine = [t for t in admin.list_topics() if t.startswith(self.topic_prefix)]
            if mine:
                admin.delete_topics(mine)
        finally:
            admin.close()


def infra_cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of this machine's PostgreSQL and Kafka broker processes (those found).

    PostgreSQL's backends come and go: the CPU of those that ended counts in their postmaster's
    reaped children (``cutime``, ``cstime``), so the difference of two readings is all of it.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    stats = {pid: stat for pid in os.listdir("/proc") if pid.isdigit() and (stat := _proc_stat(pid)) is not None}
    postgres = {pid for pid, (comm, _) in stats.items() if comm == "postgres"}
    out: dict[str, float] = {}
    for pid, (comm, fields) in stats.items():
        used = int(fields[11]) + int(fields[12])
        if pid in postgres:
            if fields[1] not in postgres:  # a postmaster: with its ended backends
                used += int(fields[13]) + int(fields[14])
            out["postgres"] = out.get("postgres", 0.0) + used / ticks
        elif comm == "java" and _is_kafka_broker(pid):
            out["kafka"] = out.get("kafka", 0.0) + used / ticks
    return out


def process_cpu_seconds(stack: LocalStack) -> dict[str, float]:
    """CPU seconds so far of the services started, this load generator, PostgreSQL and Kafka."""
    return {**stack.cpu_seconds(), "load": time.process_time(), **infra_cpu_seconds()}


def _proc_stat(pid: str) -> tuple[str, list[str]] | None:
    """A process's name and the fields of ``/proc/<pid>/stat`` after it (state first), or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.find("(") + 1 : text.rfind(")")], text[text.rfind(")") + 2 :].split()


def _is_kafka_broker(pid: str) -> bool:
    try:
        return b"kafka.Kafka" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def machine_busy_seconds() -> float:
    """CPU seconds this machine's cores have been busy (not idle, not waiting for I/O) since boot."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()  # "cpu": all cores together
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def cpu_lines(cpu: dict[str, float], machine_s: float, seconds: float, accepted: int) -> list[str]:
    """The run's CPU by process (cores), and per accepted bet (ms), with the whole machine's."""
    cores = os.cpu_count() or 1
    known = not math.isnan(machine_s)
    busy = f"; machine {machine_s / seconds:.2f} of {cores} busy" if known else ""
    lines = ["  CPU (cores): " + ", ".join(f"{k} {v / seconds:.2f}" for k, v in cpu.items()) + busy]
    if accepted:
        every = ", ".join(f"{k} {1000 * v / accepted:.2f}" for k, v in cpu.items())
        whole = f"; machine {1000 * machine_s / accepted:.2f}" if known else ""
        lines.append(f"  CPU ms per accepted bet: {every}{whole}")
    return lines


@dataclass
class Player:
    account: str
    auth: tuple[tuple[str, str]]


@dataclass
class TableState:
    table_id: str
    areas: list[str]
    round_id: str = ""
    closes_at_ms: int = 0
    betting: bool = False
    variant: str = ""
    bidder: Player | None = None  # a red-envelope table's dealer: bids in every round's bidding window
    bid_round: str = ""  # the last round the bidder bid in


@dataclass
class RunResult:
    seconds: float
    accepted: int
    latencies_ms: list[float]
    refusals: Counter[str]
    postgres: Limit  # pgbench, right after the run
    settle_lags_s: list[float]
    rounds_unsettled: int
    cpu: dict[str, float]
    metrics: dict[str, float]
    empty_calls_per_s: float = float("nan")
    handling_ms: dict[str, float] = field(default_factory=dict)
    """Mean server-side time per call of the ``HANDLED`` methods during the run."""
    group_sizes: dict[str, float] = field(default_factory=dict)
    """Mean size of the ``GROUP_SIZES`` groups during the run (bets a table transaction, holds a wallet one)."""
    machine_cpu_s: float = float("nan")
    """CPU seconds the machine's cores were busy during the run (every process)."""
    settle_published_s: list[float] = field(default_factory=list)
    """Per round: seconds from RoundSettled to the wallet's settlement event on Kafka (``SettlementLags``)."""
    settle_stages_s: dict[str, list[float]] = field(default_factory=dict)
    """Those seconds in their ``SETTLEMENT_STAGES``: per stage, each round's."""
    accepted_by_variant: Counter[str] = field(default_factory=Counter)
    work: dict[str, dict[str, float]] = field(default_factory=dict)
    """With ``--replicas``: per replica, how much of each of the ``WORK`` kinds it did during the run."""

    @property
    def bets_per_s(self) -> float:
        return self.accepted / self.seconds if self.seconds else 0.0


WORK = {
    "calls": "calls served",
    "tables": "tables owned",
    "published": "events published",
    "applied": "records applied",
}
"""The kinds of work a replica's share is shown of (``--replicas``): gRPC calls it answered (health and
reflection left out), tables whose round lease it holds at the run's end, events its relay published,
records its exactly-once consumers applied."""
WORK_SERIES = {
    "grpc_server_handled_total": "calls",
    "niuniu_outbox_published_total": "published",
    "niuniu_consumer_events_applied_total": "applied",
}
LEASE_KEY_PREFIX = "niuniu:lease:"
"""Where ``backbone.lease.RedisLease`` keeps a lease in Redis (``niuniu:lease:<name>``)."""
SHARE_BOUNDS = (0.67, 1.5)
"""A replica's share of a kind of work counts as even within these multiples of the replicas' mean."""


def replica_work(stack: LocalStack) -> dict[str, dict[str, float]]:
    """Per replica, the ``WORK_SERIES`` counters so far (from its own /metrics)."""
    work: dict[str, dict[str, float]] = {}
    for service in SERVICES:
        urls = stack.metrics_urls(service)
        for name, url in zip(stack.replica_names(service), urls, strict=True):
            counts = work[name] = dict.fromkeys(WORK_SERIES.values(), 0.0)
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    text = response.read().decode()
            except OSError:
                continue
            for line in text.splitlines():
                kind = WORK_SERIES.get(line.split("{", 1)[0])
                if kind is not None and 'grpc_service="grpc.' not in line:
                    counts[kind] += float(line.rsplit(" ", 1)[1])
    return work


def work_between(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    return {
        name: {kind: n - before.get(name, {}).get(kind, 0.0) for kind, n in counts.items()}
        for name, counts in after.items()
    }


def tables_owned(stack: LocalStack, table_ids: list[str]) -> dict[str, float]:
    """How many of ``table_ids`` each table replica holds the round lease of now (read from Redis: the
    lease's owner names its process, ``services.table.server.supervisor``)."""
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", DEFAULT_REDIS), socket_timeout=5)
    try:
        keys = [f"{LEASE_KEY_PREFIX}{lease_name(stack.topic_prefix, table_id)}" for table_id in table_ids]
        values = client.mget(keys)
    finally:
        client.close()
    by_pid = stack.replica_pids()
    owned = dict.fromkeys(stack.replica_names("table"), 0.0)
    for value in values:
        if isinstance(value, bytes):
            owner = value.decode().rpartition("|")[0]  # <host>-<pid>-<context>|<token>
            name = by_pid.get(int(owner.rsplit("-", 2)[1])) if owner.count("-") >= 2 else None
            if name in owned:
                owned[name] += 1
    return owned


def share_lines(stack: LocalStack, work: dict[str, dict[str, float]]) -> list[str]:
    """Each service's replicas' work of each kind (counts, and shares of their mean), and which fall outside
    ``SHARE_BOUNDS``; a kind no replica of a service did is left out."""
    low, high = SHARE_BOUNDS
    lines = ["  work by replica, count (share of the mean):"]
    outside: list[str] = []
    for service in SERVICES:
        names = stack.replica_names(service)
        parts = []
        for kind, label in WORK.items():
            counts = [work.get(name, {}).get(kind, 0.0) for name in names]
            if not any(counts):
                continue
            mean = sum(counts) / len(counts)
            shares = [count / mean for count in counts]
            parts.append(
                f"{label} "
                + " / ".join(f"{c:.0f}" for c in counts)
                + " ("
                + " / ".join(f"{x:.2f}" for x in shares)
                + ")"
            )
            outside += [
                f"{name} {label} {x:.2f}" for name, x in zip(names, shares, strict=True) if not low <= x <= high
            ]
        lines.append(f"    {service:<7}" + ("; ".join(parts) if parts else "none counted"))
    within = f"{low}-{high}x of the mean"
    lines.append(f"  shares outside {within}: " + ", ".join(outside) if outside else f"  every share within {within}")
    return lines


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


_STATUS = {code.value[0]: code for code in grpc.StatusCode}


def _reason(error: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str]:
    return error.code(), (error.details() or "").split(":", 1)[0][:40]


async def _retried(call: Any, request: Any, **kwargs: Any) -> Any:
    """``call(request)``, again with the same request (same id) while it is UNAVAILABLE (bounded)."""
    for attempt in range(1, SETUP_ATTEMPTS + 1):
        try:
            return await call(request, **kwargs)
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or attempt == SETUP_ATTEMPTS:
                raise
            await asyncio.sleep(SETUP_RETRY_S * attempt)
    raise AssertionError("unreachable")


async def register_players(wallet: Any, admin: tuple[tuple[str, str]], count: int, tag: str) -> list[Player]:
    gate = asyncio.Semaphore(SETUP_CONCURRENCY)

    async def one(i: int) -> Player:
        name = f"load{tag}p{i}"
        password = f"{name}-password-1"
        async with gate:
            register = wallet_pb2.RegisterRequest(
                request_id=f"reg-{name}", username=name, email=f"{name}@example.org", password=password
            )
            await _retried(wallet.Register, register)
            login = await _retried(wallet.Login, wallet_pb2.LoginRequest(username=name, password=password))
            deposit = wallet_pb2.DepositRequest(
                request_id=f"dep-{name}", account=login.account, amount_minor=DEPOSIT_MINOR
            )
            await _retried(wallet.Deposit, deposit, metadata=admin)
        return Player(login.account, bearer(login.token))

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def create_tables(
    table: Any, admin: tuple[tuple[str, str]], count: int, variants: list[str], tag: str
) -> list[TableState]:
    states = []
    for i in range(count):
        variant = variants[i % len(variants)]
        request = table_pb2.CreateTableRequest(table_id=f"load-{tag}-{i}", variant=variant, limits=LIMITS)
        info = await _retried(table.CreateTable, request, metadata=admin)  # idempotent by table id
        states.append(TableState(info.table_id, list(info.areas), variant=variant))
    return states


def house_seats(variants: list[str], count: int) -> int:
    """Players the ``count`` tables of ``variants`` (cycled) need besides the bettors: a banker for each
    banked table (baibian_bull), a dealer bidding for each red-envelope table."""
    shapes = (RoundShape.BANKER_SEAT, RoundShape.BIDDING_DEALER)
    needing = {v for v in variants if v in VARIANTS and VARIANTS[v].shape in shapes}  # others: CreateTable says
    return sum(1 for i in range(count) if variants[i % len(variants)] in needing)


async def seat_the_house(table: Any, states: list[TableState], house: list[Player]) -> None:
    """Give each banked table its banker (the whole balance as capital) and each red-envelope table the
    player who bids for its dealer seat (``follow_tables``), one of ``house`` each: the bettors are never
    a table's banker or dealer."""
    seats = iter(house)
    for state in states:
        shape = VARIANTS[state.variant].shape
        if shape is RoundShape.BANKER_SEAT:
            banker = next(seats)
            request = table_pb2.ApplyBankerRequest(table_id=state.table_id, capital_minor=0)
            await _retried(table.ApplyBanker, request, metadata=banker.auth)  # idempotent for a queued player
        elif shape is RoundShape.BIDDING_DEALER:
            state.bidder = next(seats)


async def bid_for_dealer(table: Any, state: TableState, info: Any) -> None:
    """The table's bidder bids the table's minimum for the dealer seat of the round bidding now, once."""
    assert state.bidder is not None
    request = table_pb2.PlaceBidRequest(
        command_id=f"bid-{info.current_round_id}",
        table_id=state.table_id,
        amount_minor=int(info.config.get(BID_MIN, DEFAULT_BID_MIN_MINOR)),
        round_id=info.current_round_id,
    )
    try:
        await table.PlaceBid(request, metadata=state.bidder.auth, timeout=BID_TIMEOUT_S)
    except grpc.aio.AioRpcError as error:
        if error.code() is not grpc.StatusCode.FAILED_PRECONDITION:
            return  # asked again at the follower's next look
    state.bid_round = info.current_round_id  # placed, or the window closed meanwhile


async def follow_tables(
    table: Any, admin: tuple[tuple[str, str]], states: list[TableState], stop: asyncio.Event
) -> None:
    """Keep each table's phase and window close time fresh: a GetTable every 0.2 s per table that is not
    known to be taking bets (a table whose window is open is left alone until it is about to close, so
    the follower's own calls do not compete with the bets: 60 GetTable/s on 12 tables before)."""
    while not stop.is_set():
        for state in states:
            if state.betting and state.closes_at_ms - TABLE_POLL_S * 1000 > time.time() * 1000:
                continue
            try:
                info = await table.GetTable(table_pb2.GetTableRequest(table_id=state.table_id), metadata=admin)
            except grpc.aio.AioRpcError:
                continue
            state.round_id = info.current_round_id
            state.closes_at_ms = info.betting_closes_at_unix_ms
            state.betting = info.phase == "betting"
            if state.bidder is not None and info.phase == "bidding" and state.bid_round != info.current_round_id:
                await bid_for_dealer(table, state, info)
        await asyncio.sleep(TABLE_POLL_S)


HANDLED = {"PlaceBet": "table", "PlaceBets": "table", "PlaceHolds": "wallet"}
"""Calls whose server-side time each run reports (the service that answers them): where a bet's
latency goes, the table's handling of PlaceBet (or PlaceBets) and, inside it, the wallet's of the
PlaceHolds call that carried the bet's hold with those of the bets placed at the same moment."""

GROUP_SIZES = {
    "niuniu_table_bet_group_size": "table bets a recording transaction",
    "niuniu_wallet_hold_group_size": "wallet holds a transaction",
}
"""Group-commit histograms whose mean each run reports: how many bets share the fixed costs."""


def call_name(bets_per_call: int) -> str:
    return "PlaceBet" if bets_per_call == 1 else "PlaceBets"


def scrape(urls: list[str]) -> dict[str, float]:
    """Sums of the samples of the backlog/lag/settlement-lag series over ``urls``, and the handling
    time (``<method>_seconds`` / ``<method>_count``) of the ``HANDLED`` calls."""
    wanted = (
        "niuniu_outbox_pending_events",
        "niuniu_consumer_lag_messages",
        "niuniu_wallet_settlement_lag_seconds_sum",
        "niuniu_wallet_settlement_lag_seconds_count",
        *(f"{series}_{part}" for series in GROUP_SIZES for part in ("sum", "count")),
    )
    totals: dict[str, float] = {}
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in wanted:
                totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            elif name in ("grpc_server_handling_seconds_sum", "grpc_server_handling_seconds_count"):
                for method in HANDLED:
                    if f'grpc_method="{method}"' in line:
                        key = f"{method}_{'seconds' if name.endswith('_sum') else 'count'}"
                        totals[key] = totals.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def mean_between(before: dict[str, float], after: dict[str, float], total: str, count: str) -> float:
    """The mean of what a sum and a count scraped (``total`` / ``count`` keys) observed between two
    scrapes (nan: none)."""
    n = after.get(count, 0.0) - before.get(count, 0.0)
    return (after.get(total, 0.0) - before.get(total, 0.0)) / n if n > 0 else float("nan")


def mean_group(before: dict[str, float], after: dict[str, float], series: str) -> float:
    """The mean size of the groups ``series`` observed between two scrapes (nan: none)."""
    return mean_between(before, after, f"{series}_sum", f"{series}_count")


def handling_ms(before: dict[str, float], after: dict[str, float], method: str) -> float:
    """The mean server-side time of ``method``'s calls between two scrapes, in ms (nan: none)."""
    return 1_000 * mean_between(before, after, f"{method}_seconds", f"{method}_count")


SETTLEMENT_STAGES = (
    "the table's relay took it",
    "the wallet began applying it",
    "the wallet's relay took its event",
)
"""Where a settlement's way to Kafka as the wallet's event went, stage by stage (``SettlementLags.stages``):
from the table's RoundSettled to its relay's transaction that took the event (the commit and the relay's
wait), from there to the wallet's transaction that applied it (Kafka's send and fetch, and the wait behind
the settlements before it: the consumer's ``applied_at``), and from there to the wallet's relay taking its
settlement event (the application, its commit, the relay's wait). Each stage ends where the next begins, so
a round's three add up to its ``published`` lag. A relay's time is its transaction's start (``now()``), and
that transaction may have begun before the commit its later statement saw: a stage can read a few
milliseconds below zero."""


@dataclass(frozen=True)
class SettlementLags:
    """Per round settled during a run, seconds from the table's RoundSettled to the wallet's movements for
    it (``applied``: their time, taken as the wallet starts applying it) and to its settlement event on
    Kafka (``published``: the relay's, after the wallet's COMMIT: what the ledger can see), and that last
    one in its ``SETTLEMENT_STAGES`` (``stages``: per stage, its seconds for each round)."""

    applied: list[float]
    published: list[float]
    missing: int  # rounds the wallet had not applied and published within DRAIN_TIMEOUT_S
    stages: dict[str, list[float]] = field(default_factory=dict)


async def settlement_lags(stack: LocalStack, since: float) -> SettlementLags:
    """The lags of the rounds settled since ``since``, once the wallet applied and published them all (bounded)."""
    table_schema, wallet_schema = stack.schema("table"), stack.schema("wallet")
    query = sql.SQL(
        "SELECT s.correlation_id, extract(epoch FROM coalesce("
        " (SELECT max(w.occurred_at) FROM {w}.wallet_entries w"
        "  WHERE w.round_id = s.correlation_id AND w.source = 'settlement'),"
        " (SELECT r.updated_at FROM {w}.wallet_rounds r WHERE r.round_id = s.correlation_id)) - s.occurred_at),"
        " extract(epoch FROM t.wallet_took - s.occurred_at),"
        " extract(epoch FROM t.table_took - s.occurred_at),"
        " extract(epoch FROM t.applying - t.table_took),"
        " extract(epoch FROM t.wallet_took - t.applying)"
        " FROM {t}.events s CROSS JOIN LATERAL (SELECT"
        "  (SELECT o.published_at FROM {t}.outbox o WHERE o.position = s.position) AS table_took,"
        "  (SELECT min(p.applied_at) FROM {w}.processed_events p WHERE p.event_id = s.event_id) AS applying,"
        "  (SELECT min(o.published_at) FROM {w}.events e JOIN {w}.outbox o USING (position)"
        "   WHERE e.correlation_id = s.correlation_id AND e.event_type = 'wallet.round_settlement_applied')"
        "   AS wallet_took) t"
        " WHERE s.event_type = 'table.round_settled' AND s.occurred_at >= to_timestamp(%s)"
    ).format(w=sql.Identifier(wallet_schema), t=sql.Identifier(table_schema))
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    async with await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        while True:
            cur = await conn.execute(query, (since,))
            rows = await cur.fetchall()
            missing = sum(1 for r in rows if r[1] is None or r[2] is None)
            if not missing or time.monotonic() > deadline:
                staged = [r[3:] for r in rows if None not in r[3:]]  # the rounds with every stage's time
                return SettlementLags(
                    [float(r[1]) for r in rows if r[1] is not None],
                    [float(r[2]) for r in rows if r[2] is not None],
                    missing,
                    {stage: [float(r[i]) for r in staged] for i, stage in enumerate(SETTLEMENT_STAGES)},
                )
            await asyncio.sleep(0.5)


async def bet_phase(
    table: Any,
    players: list[Player],
    states: list[TableState],
    in_flight: int,
    rate: float,
    duration: float,
    bets_per_call: int = 1,
) -> tuple[float, Counter[str], list[float], Counter[str]]:
    """Keeps ``in_flight`` calls outstanding for ``duration`` s: PlaceBet, or PlaceBets of ``bets_per_call``
    bets of one player at one table. Answers the seconds, the bets accepted by variant, each call's latency
    (ms) and the refusals by reason (a refused call's, or a refused bet's inside PlaceBets)."""
    rng = random.Random()
    latencies: list[float] = []
    refusals: Counter[str] = Counter()
    accepted: Counter[str] = Counter(dict.fromkeys((s.variant for s in states), 0))  # every variant, 0 too
    started = time.monotonic()
    deadline = started + duration
    interval = in_flight / rate if rate > 0 else 0.0

    def count_refusal(state: TableState, code: grpc.StatusCode, reason: str) -> None:
        """A refused call's, or a refused bet's inside PlaceBets."""
        refusals[f"{code.name}:{reason}"] += 1
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            state.betting = False  # wait for the follower's next look at this table

    async def worker(n: int) -> None:
        next_at = started + (interval * n / in_flight if interval else 0.0)
        while True:
            now = time.monotonic()
            if now >= deadline:
                return
            if interval:
                if next_at > now:
                    await asyncio.sleep(min(next_at, deadline) - now)
                    continue
                next_at += interval
            open_now = [s for s in states if s.betting and s.closes_at_ms - CLOSING_MARGIN_MS > time.time() * 1000]
            if not open_now:
                await asyncio.sleep(0.02)
                continue
            state, player = rng.choice(open_now), rng.choice(players)
            requests = [
                table_pb2.PlaceBetRequest(
                    command_id=uuid.uuid4().hex,
                    table_id=state.table_id,
                    area=rng.choice(state.areas),
                    amount_minor=STAKE_MINOR,
                    round_id=state.round_id,
                )
                for _ in range(bets_per_call)
            ]
            sent = time.perf_counter()
            try:
                if bets_per_call == 1:
                    await table.PlaceBet(requests[0], metadata=player.auth, timeout=30)
                    refused = []
                else:
                    answer = await table.PlaceBets(
                        table_pb2.PlaceBetsRequest(bets=requests), metadata=player.auth, timeout=30
                    )
                    refused = [o.refused for o in answer.outcomes if o.WhichOneof("outcome") == "refused"]
            except grpc.aio.AioRpcError as error:
                count_refusal(state, *_reason(error))
                continue
            latencies.append((time.perf_counter() - sent) * 1000)
            accepted[state.variant] += bets_per_call - len(refused)
            for refusal in refused:
                count_refusal(state, _STATUS.get(refusal.code, grpc.StatusCode.UNKNOWN), refusal.reason)

    await asyncio.gather(*(worker(n) for n in range(in_flight)))
    return time.monotonic() - started, accepted, latencies, refusals


async def empty_call_rate(channel: grpc.aio.Channel, in_flight: int, seconds: float = EMPTY_CALL_S) -> float:
    """Health ``Check`` calls a second that ``channel``'s server answers with ``in_flight`` outstanding.

    The call reads nothing and writes nothing; it goes through the same gRPC server, interceptors
    and event loop as PlaceBet, so it is the ceiling of one call to that process here and now.
    """
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest()
    answered = 0
    started = time.monotonic()
    deadline = started + seconds

    async def worker() -> None:
        nonlocal answered
        while time.monotonic() < deadline:
            await stub.Check(request, timeout=30)  # type: ignore[attr-defined]
            answered += 1

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return answered / (time.monotonic() - started)


def _profile(stack: LocalStack, out_dir: Path, run: int, seconds: float) -> list[subprocess.Popen[bytes]]:
    spy = Path(sys.executable).parent / "py-spy"
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                str(spy),
                "record",
                "-f",
                "raw",
                "-r",
                "50",
                "-d",
                str(int(seconds)),
                "-p",
                str(pid),
                "-o",
                str(out_dir / f"{name}-run{run}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for pid, name in stack.replica_pids().items()
    ]


def print_run(n: int, r: RunResult, in_flight: int, out: Any, bets_per_call: int = 1) -> None:
    lat = r.latencies_ms
    refused = sum(r.refusals.values())
    calls = "" if bets_per_call == 1 else f", PlaceBets of {bets_per_call} bets"
    print(
        f"run {n}: {r.accepted} bets accepted in {r.seconds:.1f} s = {r.bets_per_s:.0f}/s"
        f" ({in_flight} in flight{calls}); refused {refused}",
        file=out,
    )
    if len(r.accepted_by_variant) > 1:
        print(
            "  accepted by variant  " + ", ".join(f"{v} {n}" for v, n in sorted(r.accepted_by_variant.items())),
            file=out,
        )
    print(
        f"  {call_name(bets_per_call)} latency ms  p50 {percentile(lat, 50):.1f}  p90 {percentile(lat, 90):.1f}"
        f"  p99 {percentile(lat, 99):.1f}  max {max(lat, default=float('nan')):.1f}",
        file=out,
    )
    if r.handling_ms:
        print(
            "  mean server-side ms  "
            + ", ".join(f"{HANDLED[m]} {m} {ms:.1f}" for m, ms in r.handling_ms.items() if not math.isnan(ms))
            + f"  (the caller's mean {statistics.fmean(lat) if lat else float('nan'):.1f})",
            file=out,
        )
    if any(not math.isnan(size) for size in r.group_sizes.values()):
        print(
            "  mean group  "
            + ", ".join(f"{GROUP_SIZES[g]} {size:.1f}" for g, size in r.group_sizes.items() if not math.isnan(size)),
            file=out,
        )
    if r.refusals:
        print("  refusals  " + ", ".join(f"{k} {v}" for k, v in r.refusals.most_common(8)), file=out)
    for what, s in (
        ("wallet's last movement", r.settle_lags_s),
        ("its settlement event on Kafka", r.settle_published_s),
    ):
        if s:
            print(
                f"  settlement -> {what}, {len(s)} rounds: min {min(s):.3f} s  median"
                f" {statistics.median(s):.3f} s  p99 {percentile(s, 99):.3f} s  max {max(s):.3f} s",
                file=out,
            )
    if any(r.settle_stages_s.values()):
        print(
            "  of which, median / max s: "
            + ", ".join(
                f"{stage} {statistics.median(s):.3f} / {max(s):.3f}" for stage, s in r.settle_stages_s.items() if s
            ),
            file=out,
        )
    if r.rounds_unsettled:
        print(f"  {r.rounds_unsettled} rounds not applied and published within {DRAIN_TIMEOUT_S:.0f} s", file=out)
    m = r.metrics
    print(
        f"  end of run: outbox backlog {m.get('niuniu_outbox_pending_events', float('nan')):.0f} events,"
        f" consumer lag {m.get('niuniu_consumer_lag_messages', float('nan')):.0f} messages",
        file=out,
    )
    if r.cpu:
        for line in cpu_lines(r.cpu, r.machine_cpu_s, r.seconds, r.accepted):
            print(line, file=out)
    print(f"  PostgreSQL right after: {r.postgres} -> bets/s are {r.postgres.ratio(r.bets_per_s)} of it", file=out)
    empty = 100 * r.bets_per_s / r.empty_calls_per_s if r.empty_calls_per_s else float("nan")
    print(
        f"  the table's empty calls (health Check), {in_flight} in flight, right after:"
        f" {r.empty_calls_per_s:.0f}/s -> bets/s are {empty:.1f} % of it",
        file=out,
    )


async def main_async(args: argparse.Namespace) -> int:
    out = sys.stdout
    if not args.replicas:
        results, clean = await session(args, out, None)
        print_summary(results, args, out)
        return 0 if clean else 1
    rates: dict[int, float] = {}
    clean = True
    for n in args.replicas:
        share = f"{args.cpu_per_replica:g} of a core each" if args.cpu_per_replica else "no CPU quota"
        print(f"== {n} replica{'s' if n > 1 else ''} of each service ({share}) ==", file=out, flush=True)
        results, ok = await session(args, out, n)
        print_summary(results, args, out)
        clean = clean and ok
        rates[n] = statistics.median(r.bets_per_s for r in results)
    print(scaling_line(rates), file=out)
    return 0 if clean else 1


def scaling_line(rates: dict[int, float]) -> str:
    """``scaling: N=1 <bets/s>, N=2 <bets/s> (<ratio>x), ...``: each N's median rate, and its ratio to the first."""
    first = next(iter(rates.values()))
    parts = [
        f"N={n} {rate:.0f}" + (f" ({rate / first:.2f}x)" if i and first else "")
        for i, (n, rate) in enumerate(rates.items())
    ]
    return "scaling: " + ", ".join(parts)


async def session(args: argparse.Namespace, out: Any, replicas: int | None) -> tuple[list[RunResult], bool]:
    """Set up players and tables and bet: the runs' results, and whether ``--audit`` found the journal clean.

    Against ``--table``, or the services started here (``replicas`` of each: with ``--cpu-per-replica``,
    each held to that share of a core from the warm-up on).
    """
    tag = uuid.uuid4().hex[:6]
    tokens = Tokens.development()
    stack: LocalStack | None = None
    if args.table:
        table_addr, wallet_addr = _loopback(args.table), _loopback(args.wallet)
        metrics_urls = [_loopback(u) for u in args.metrics.split(",") if u]
    else:
        stack = LocalStack(tag, Path(args.log_dir) / tag, replicas or 1)
        print(f"starting the four services (logs in {stack.log_dir})", file=out, flush=True)
        table_addr, wallet_addr = stack.addr("table"), stack.addr("wallet")
        metrics_urls = stack.metrics_urls()
    groups = CpuGroups(QUOTA_PARENT)
    try:
        if stack is not None:
            stack.start()  # inside the try: services already started are stopped if a later one fails
        options = tls.channel_options()
        async with (
            grpc.aio.insecure_channel(table_addr, options=options) as tch,
            grpc.aio.insecure_channel(wallet_addr, options=options) as wch,
        ):
            bench = Bench(args, out, tokens, tch, wch, stack, metrics_urls, replicas is not None)
            await bench.set_up(tag)
            if stack is not None and replicas is not None and args.cpu_per_replica:
                cap_replicas(groups, stack, args.cpu_per_replica, out)
            return await bench.run_all()
    finally:
        if stack is not None:
            stack.stop()
            groups.close()
            if not args.keep:
                await stack.drop()


def cap_replicas(groups: CpuGroups, stack: LocalStack, share: float, out: Any) -> None:
    """Hold every replica to ``share`` of a core, each in a CPU group of its own."""
    for pid, name in stack.replica_pids().items():
        groups.cap(f"{stack.run_id}-{name}", pid, share)
    print(
        f"each of the {len(stack.replica_pids())} replicas held to {share:g} of a core"
        f" (cgroup cpu {CPU_ROOT / QUOTA_PARENT}/{stack.run_id}-*)",
        file=out,
        flush=True,
    )


@dataclass
class Bench:
    """One session's clients and what its runs measure."""

    args: argparse.Namespace
    out: Any
    tokens: Tokens
    table_channel: grpc.aio.Channel
    wallet_channel: grpc.aio.Channel
    stack: LocalStack | None
    metrics_urls: list[str]
    by_replica: bool
    players: list[Player] = field(default_factory=list)
    states: list[TableState] = field(default_factory=list)

    @property
    def table(self) -> Any:
        return table_pb2_grpc.TableStub(self.table_channel)

    async def set_up(self, tag: str) -> None:
        """Register and fund the players, create the tables and seat their house players."""
        admin = bearer(self.tokens.issue("load-admin", Role.ADMIN))
        wallet = wallet_pb2_grpc.WalletStub(self.wallet_channel)
        started = time.monotonic()
        args, variants = self.args, self.args.variants.split(",")
        registered = await register_players(wallet, admin, args.players + house_seats(variants, args.tables), tag)
        self.players, house = registered[: args.players], registered[args.players :]
        self.states = await create_tables(self.table, admin, args.tables, variants, tag)
        await seat_the_house(self.table, self.states, house)
        print(
            f"{len(self.players)} players registered and funded, {len(self.states)} tables"
            f" ({args.variants}) in {time.monotonic() - started:.1f} s",
            file=self.out,
            flush=True,
        )

    async def run_all(self) -> tuple[list[RunResult], bool]:
        """Warm up, then ``--runs`` runs (each printed); then ``--audit``."""
        admin = bearer(self.tokens.issue("load-admin", Role.ADMIN))
        stop = asyncio.Event()
        follower = asyncio.create_task(follow_tables(self.table, admin, self.states, stop))
        results: list[RunResult] = []
        try:
            if self.args.warmup > 0:
                await warm_up(self.table, self.players, self.states, self.args, self.stack, self.out)
            for run in range(1, self.args.runs + 1):
                results.append(await self.run_once(run))
            clean = True
            if self.args.audit and self.stack is not None:
                clean = await asyncio.to_thread(audit_replay, self.stack, self.tokens, self.out)
            return results, clean
        finally:
            stop.set()
            await follower

    async def run_once(self, run: int) -> RunResult:
        args, stack = self.args, self.stack
        since = time.time()
        cpu_before = process_cpu_seconds(stack) if stack else {}
        machine_before = machine_busy_seconds()
        metrics_before = scrape(self.metrics_urls)
        work_before = replica_work(stack) if stack and self.by_replica else {}
        spies = _profile(stack, Path(args.profile), run, args.duration) if stack and args.profile else []
        seconds, by_variant, latencies, refusals = await bet_phase(
            self.table, self.players, self.states, args.in_flight, args.rate, args.duration, args.bets_per_call
        )
        cpu_after = process_cpu_seconds(stack) if stack else {}
        machine_s = machine_busy_seconds() - machine_before
        metrics = scrape(self.metrics_urls)
        work = work_between(work_before, replica_work(stack)) if stack and self.by_replica else {}
        if stack and self.by_replica:
            for name, owned in tables_owned(stack, [s.table_id for s in self.states]).items():
                work[name]["tables"] = owned
        for spy in spies:
            spy.wait(timeout=60)
        lags = await settlement_lags(stack, since) if stack else SettlementLags([], [], 0)
        result = RunResult(
            seconds,
            sum(by_variant.values()),
            latencies,
            refusals,
            await pgbench_commits(os.environ["DATABASE_URL"]),
            lags.applied,
            lags.missing,
            {k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after},
            metrics,
            await empty_call_rate(self.table_channel, args.in_flight),
            {m: handling_ms(metrics_before, metrics, m) for m in HANDLED},
            machine_cpu_s=machine_s,
            accepted_by_variant=by_variant,
            settle_published_s=lags.published,
            settle_stages_s=lags.stages,
            group_sizes={g: mean_group(metrics_before, metrics, g) for g in GROUP_SIZES},
            work=work,
        )
        print_run(run, result, args.in_flight, self.out, args.bets_per_call)
        if stack and self.by_replica:
            for line in share_lines(stack, work):
                print(line, file=self.out)
        self.out.flush()
        return result


def print_summary(results: list[RunResult], args: argparse.Namespace, out: Any) -> None:
    """Min / median / max of the runs' figures (with more than one run)."""
    if len(results) < 2:
        return

    def mmm(values: list[float], fmt: str = "{:.0f}") -> str:
        return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))

    print(f"summary of {len(results)} runs (min / median / max):", file=out)
    print(f"  accepted bets/s        {mmm([r.bets_per_s for r in results])}", file=out)
    for p in (50, 99):
        call = f"{call_name(args.bets_per_call)} p{p} ms".ljust(23)
        print(f"  {call}{mmm([percentile(r.latencies_ms, p) for r in results], '{:.1f}')}", file=out)
    lag_max = [max(r.settle_lags_s) for r in results if r.settle_lags_s]
    if lag_max:
        print(f"  worst settlement lag s {mmm(lag_max, '{:.2f}')}", file=out)
    published_max = [max(r.settle_published_s) for r in results if r.settle_published_s]
    if published_max:
        print(f"  worst to Kafka s       {mmm(published_max, '{:.2f}')}   (wallet's settlement event)", file=out)
    busy = [r.machine_cpu_s / r.seconds for r in results if r.seconds and not math.isnan(r.machine_cpu_s)]
    if busy:
        print(f"  machine busy cores     {mmm(busy, '{:.2f}')}   (of {os.cpu_count()})", file=out)
    print(f"  PostgreSQL commits/s   {mmm([r.postgres.per_s for r in results])}   (pgbench)", file=out)
    print(f"  table empty calls/s    {mmm([r.empty_calls_per_s for r in results])}", file=out)


async def warm_up(
    table: Any,
    players: list[Player],
    states: list[TableState],
    args: argparse.Namespace,
    stack: LocalStack | None,
    out: Any,
) -> None:
    """Bets for ``--warmup`` seconds, not counted, then the run's tables analyzed (with the services started here)."""
    seconds, by_variant, _, _ = await bet_phase(
        table, players, states, args.in_flight, args.rate, args.warmup, args.bets_per_call
    )
    analyzed = await stack.analyze() if stack is not None else 0
    then = f"; then ANALYZE of the run's {analyzed} tables" if stack is not None else ""
    print(f"warm-up: {sum(by_variant.values())} bets in {seconds:.1f} s, not counted{then}", file=out, flush=True)


AUDIT_TIMEOUT_S = 900


def audit_replay(stack: LocalStack, tokens: Tokens, out: Any) -> bool:
    """``niuniu-audit replay`` of the run's journal (as an auditor, with the wallet's balances); True if clean."""
    argv = [
        str(Path(sys.executable).parent / "niuniu-audit"),
        "replay",
        "--schema",
        stack.schema("ledger"),
        "--topic-prefix",
        stack.topic_prefix,
        "--wallet",
        stack.addr("wallet"),
        "--dsn",
        os.environ["DATABASE_URL"],
        "--no-progress",
    ]
    env = {**stack.env("ledger"), "NIUNIU_AUDITOR_TOKEN": tokens.issue("load-auditor", Role.AUDITOR)}
    print("niuniu-audit replay of this run's journal:", file=out, flush=True)
    started = time.monotonic()
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=AUDIT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        print(f"  no verdict within {AUDIT_TIMEOUT_S} s", file=out)
        return False
    text = done.stdout + done.stderr
    for line in text.splitlines():
        if line.lstrip().startswith(("events", "entries", "differences", "wallet", "RESULT")):
            print(f"  {line.strip()}", file=out)
    print(f"  the audit took {time.monotonic() - started:.1f} s", file=out)
    clean = done.returncode == 0 and "RESULT: OK" in text
    if not clean:
        print(f"  exit {done.returncode}: {text[-600:]}", file=out)
    return clean


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="niuniu-load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=12)
    parser.add_argument("--variants", default="golden_bull", help="comma-separated, cycled over the tables")
    parser.add_argument("--players", type=int, default=400)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--rate", type=float, default=0.0, help="calls per second (0: flat out)")
    parser.add_argument(
        "--bets-per-call", type=int, default=1, help="1: PlaceBet; 2-16: PlaceBets calls of that many bets"
    )
    parser.add_argument(
        "--warmup", type=float, default=10.0, help="seconds of uncounted bets before the runs, then ANALYZE (0: none)"
    )
    parser.add_argument("--duration", type=float, default=40.0, help="seconds per run")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--table", default="", help="table address (default: start the services here)")
    parser.add_argument("--wallet", default="127.0.0.1:50053")
    parser.add_argument("--metrics", default="", help="comma-separated /metrics URLs of the services")
    parser.add_argument("--profile", default="", help="record each service with py-spy into this directory")
    parser.add_argument("--log-dir", default=".run/load")
    parser.add_argument("--keep", action="store_true", help="keep the started services' schemas")
    parser.add_argument("--audit", action="store_true", help="niuniu-audit replay after the last run")
    parser.add_argument(
        "--replicas", type=_counts, default=[], help="e.g. 1,2,3: for each N, N replicas of each service started here"
    )
    parser.add_argument(
        "--cpu-per-replica", type=float, default=0.0, help="with --replicas: each replica's CPU quota, cores (0: none)"
    )
    args = parser.parse_args(argv)
    bounds = (
        (1 <= args.tables <= MAX_TABLES, f"--tables 1..{MAX_TABLES}"),
        (1 <= args.players <= MAX_PLAYERS, f"--players 1..{MAX_PLAYERS}"),
        (1 <= args.in_flight <= MAX_IN_FLIGHT, f"--in-flight 1..{MAX_IN_FLIGHT}"),
        (0 < args.duration <= MAX_DURATION_S, f"--duration 0..{MAX_DURATION_S}"),
        (0 <= args.warmup <= MAX_DURATION_S, f"--warmup 0..{MAX_DURATION_S}"),
        (1 <= args.runs <= 20, "--runs 1..20"),
        (args.rate >= 0, "--rate >= 0"),
        (1 <= args.bets_per_call <= MAX_BETS_PER_CALL, f"--bets-per-call 1..{MAX_BETS_PER_CALL}"),
        (not (args.audit and args.table), "--audit needs the services this command starts (no --table)"),
        (not (args.replicas and args.table), "--replicas needs the services this command starts (no --table)"),
        (all(1 <= n <= MAX_REPLICAS for n in args.replicas), f"--replicas: each 1..{MAX_REPLICAS}"),
        (args.cpu_per_replica == 0 or 0.01 <= args.cpu_per_replica <= 64, "--cpu-per-replica 0.01..64 (0: none)"),
        (not args.cpu_per_replica or bool(args.replicas), "--cpu-per-replica goes with --replicas"),
    )
    for ok, message in bounds:
        if not ok:
            parser.error(message)
    if "DATABASE_URL" not in os.environ:
        parser.error("DATABASE_URL must name the PostgreSQL to probe (source .run/env)")
    if args.cpu_per_replica and (reason := unavailable_reason()):
        parser.error(f"--cpu-per-replica: {reason}")
    return asyncio.run(main_async(args))


def _counts(text: str) -> list[int]:
    """``1,2,3`` -> [1, 2, 3]."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of whole numbers, not {text!r}") from None


if __name__ == "__main__":
    sys.exit(main())
