"""niuniu-chaos: play every variant while faults are injected, then check that nothing was lost.

``niuniu-chaos [--rounds N] [--seed N] [--cycles N] [--faults kind,...] [--report PATH]`` starts a Kafka,
a PostgreSQL and a Redis of its own (``scripts/infra`` in a run directory of its own, on free
ports: the shared infrastructure is never touched), two replicas of each of the four services as
processes, all of them active (clients and services spread their calls over both), each of
their links through a fault proxy (tools/chaos/proxy.py), several tables of every variant
with bot players, and injects faults from a schedule drawn from the seed (same seed, same
schedule), each at a random phase of a random round of a random table:

  kill_rng, kill_table, kill_wallet, kill_ledger   SIGKILL a replica (the table's: the owner of
                     the fault's table), then restart it
  sigstop            SIGSTOP a replica for longer than the leases, then SIGCONT
  replica_takeover   a third table replica starts; the owner of the fault's table is SIGKILLed
                     for good and the new one takes its place
  kafka_restart      the broker stopped and started again
  postgres_restart   pg_ctl -m immediate, then started again
  redis_wipe         Redis SIGKILLed (no persistence: everything it held is gone), restarted
  slow_link          one link (a service to PostgreSQL, Redis, Kafka or another service) slowed
  cut_link           one link cut (connections reset) for a while
  clock_forward      every service's clock moved hours forward (libfaketime)

After each fault is healed, play must resume: every table ends a round. After the schedule
(at least ``--cycles`` cycles, each injecting every kind once, and ``--rounds`` settled
rounds) the bots stop, the system drains, and the checks run:
every round settled or voided; every hold resolved; the accounts sum to the deposits; the
ledger's trial balance is zero and equals the wallet; ``niuniu-audit replay`` is clean;
every settled round verifies from its revealed seed (``niuniu-audit verify-round``, which
re-deals and re-settles it); no update on any watch stream carried a card before its
reveal; no client was ever told INTERNAL or UNKNOWN; every replica did its share of the work
(calls served; tables taken; events published; records applied). It prints, per fault kind, how many
were injected and survived and the longest stall of play, writes a JSON report, and exits
1 if any check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import text_format
from niuniu.ledger.v1 import ledger_pb2, ledger_pb2_grpc
from niuniu.table.v1 import table_pb2, table_pb2_grpc
from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc

from backbone.auth import Role, Tokens, bearer, development_env
from backbone.kafka import default_principal_env
from tools.chaos.bots import VARIANTS, Clients, TableBots, kind, new_player, retry
from tools.chaos.stack import BIN, SERVICES, ChaosInfra, ServiceSet

FAULT_KINDS = (
    "kill_rng",
    "kill_table",
    "kill_wallet",
    "kill_ledger",
    "sigstop",
    "replica_takeover",
    "kafka_restart",
    "postgres_restart",
    "redis_wipe",
    "slow_link",
    "cut_link",
    "clock_forward",
)
LINKS = (
    *(f"{s}->{d}" for s in SERVICES for d in ("pg", "redis")),
    "table->rng",
    "table->wallet",
    "ledger->table",
    "ledger->wallet",
    "all->kafka",
)
WORK_KINDS = {
    "rng": ("calls",),
    "table": ("calls", "tables", "published"),
    "wallet": ("calls", "published"),
    "ledger": ("applied",),
}
"""The work each replica of a service must have done (``ServiceSet.work``): the kinds every replica of it has
some of whatever the keys' hashing (a wallet replica may own no partition a settlement came by)."""
TRIGGERS = ("round_opened", "phase_changed", "hand_revealed", "result", "seed_revealed")
CLOCK_STEPS_S = (3_600, 6 * 3_600, 13 * 3_600, 25 * 3_600)
LEASE_S = 5.0  # the table's lease (services/table/runner.py LEASE_TTL_MS)
RECOVERY_S = 180.0  # a fault not followed by play at every table within this is not survived
TRIGGER_WAIT_S = 60.0
DRAIN_S = 300.0
CLOSE_BUDGET_S = 30.0
EXTERNAL = "external:cashier"
PLAYERS_PER_TABLE = 3


# ----------------------------------------------------------------------------------------- schedule


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: what, where, and when (the phase of which round at which table)."""

    n: int
    kind: str
    table: int  # index into the run's tables
    rounds_ahead: int  # the fault hits this many rounds after the one in play
    trigger: str  # ... when this update of that round is seen
    delay_s: float  # ... plus this
    duration_s: float  # how long a stop, cut, slow link or outage lasts
    target: str = ""  # the service or link
    amount: int = 0  # ms of delay (slow_link), seconds forward (clock_forward)


def schedule(seed: int, kinds: Sequence[str], tables: int) -> Iterator[Fault]:
    """An endless schedule: cycles, each every kind once in an order drawn from ``seed``."""
    r = random.Random(seed)
    n = 0
    while True:
        cycle = list(kinds)
        r.shuffle(cycle)
        for k in cycle:
            target, amount, duration = "", 0, 0.0
            if k == "sigstop":
                target, duration = r.choice(SERVICES), r.uniform(LEASE_S + 2, LEASE_S + 10)
            elif k in ("slow_link", "cut_link"):
                target = r.choice(LINKS)
                duration = r.uniform(4, 15)
                amount = r.choice((200, 500, 1_000, 2_000)) if k == "slow_link" else 0
            elif k == "clock_forward":
                amount = r.choice(CLOCK_STEPS_S)
            elif k in ("postgres_restart", "redis_wipe"):
                duration = r.uniform(0.5, 5)
            n += 1
            yield Fault(
                n,
                k,
                r.randrange(tables),
                r.randint(0, 2),
                r.choice(TRIGGERS),
                round(r.uniform(0, 1.5), 3),
                round(duration, 3),
                target,
                amount,
            )


# ----------------------------------------------------------------------------------------- the run


@dataclass
class Outcome:
    fault: Fault
    injected_at: float = 0.0
    healed_at: float = 0.0
    recovered_at: float = 0.0
    survived: bool = False
    stall_s: float = 0.0
    detail: str = ""
    error: str = ""
    wallet_applies_after_s: float | None = None


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Options:
    rounds: int = 100
    seed: int = 1
    kinds: tuple[str, ...] = FAULT_KINDS
    tables_per_variant: int = 2
    report: Path | None = None
    run_dir: Path | None = None
    keep: bool = False
    max_faults: int = 0  # 0: whole cycles until --rounds
    cycles: int = 10  # at least this many whole cycles (every kind once each)


class Chaos:
    def __init__(self, opts: Options, out: Any = sys.stdout) -> None:
        self.opts = opts
        self.out = out
        self.run_id = uuid.uuid4().hex[:8]
        self.run_dir = (opts.run_dir or Path(tempfile.gettempdir()) / f"niuniu-chaos-{self.run_id}").resolve()
        self.infra = ChaosInfra(self.run_dir)
        self.services: ServiceSet | None = None
        self.tables: list[TableBots] = []
        self.outcomes: list[Outcome] = []
        self.checks: list[Check] = []
        self.clients: Clients | None = None
        self.work: dict[str, dict[str, float]] = {}
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", file=self.out, flush=True)

    @property
    def svc(self) -> ServiceSet:
        assert self.services is not None
        return self.services

    def admin(self) -> tuple[tuple[str, str]]:
        offset = self.svc.clock_offset_s
        tokens = Tokens.development(clock=lambda: time.time() + offset)  # the services' clock
        return bearer(tokens.issue("chaos-admin", Role.ADMIN))

    def auditor(self) -> tuple[tuple[str, str]]:
        offset = self.svc.clock_offset_s
        return bearer(Tokens.development(clock=lambda: time.time() + offset).issue("chaos-auditor", Role.AUDITOR))

    # -- main -------------------------------------------------------------------------------------

    def run(self) -> int:
        self.say(f"run dir {self.run_dir}; starting Kafka, PostgreSQL and Redis of our own")
        try:
            env = self.infra.up()
            os.environ.update(development_env(os.environ))
            os.environ.update(default_principal_env(env))  # the audit, too, reads the run's prefixed topics
            self.services = ServiceSet(self.run_id, self.infra, self.run_dir / "services")
            self.svc.start_all()
            self.say("services serving; tables opening")
            asyncio.run(self._play())
        finally:
            if self.services is not None:
                self.services.stop_all()
            self.infra.down()
            if not self.opts.keep:
                shutil.rmtree(self.run_dir, ignore_errors=True)
        return self.report()

    async def _play(self) -> None:
        svc = self.svc
        async with (
            grpc.aio.insecure_channel(svc.addr("wallet")) as w,
            grpc.aio.insecure_channel(svc.addr("table")) as t,
            grpc.aio.insecure_channel(svc.addr("ledger")) as lg,
        ):
            c = Clients(wallet_pb2_grpc.WalletStub(w), table_pb2_grpc.TableStub(t), self.admin)
            self.clients = c
            ledger = ledger_pb2_grpc.LedgerStub(lg)
            await self._open_tables(c)
            try:
                await self._inject_all()
                self.say("schedule done; draining")
                drain_started = time.monotonic()
                for table in self.tables:
                    table.betting = False
                try:
                    await self._drain(c, ledger, drain_started)
                except Exception as error:  # the checks tell what did not drain
                    self.say(f"drain: {type(error).__name__}: {error}")
            finally:
                for table in self.tables:
                    await table.stop()
            try:
                await self._check(c, ledger)
            except Exception as error:  # a check that could not run is a failed check, reported as such
                self.checks.append(Check("checks_ran", False, f"{type(error).__name__}: {error}"))

    async def _open_tables(self, c: Clients) -> None:
        r = random.Random(self.opts.seed)
        n = 0
        for variant in VARIANTS:
            for i in range(self.opts.tables_per_variant):
                table_id = f"chaos-{variant.replace('_', '-')}-{i + 1}"
                players = [await new_player(c, f"c{self.run_id}t{n}p{k}") for k in range(PLAYERS_PER_TABLE)]
                bots = TableBots(c, table_id, variant, players, random.Random(r.random()))
                await bots.create()
                bots.start()
                self.tables.append(bots)
                n += 1
        # Play settles in before the first fault.
        await self._wait_play(time.monotonic(), RECOVERY_S)
        self.say(f"{len(self.tables)} tables playing")

    def settled_rounds(self) -> int:
        return sum(1 for t in self.tables for _, status in t.ended.values() if status == "settled")

    async def _wait_play(self, since: float, timeout_s: float) -> float | None:
        """When every table had ended a round after ``since`` (None: not within the timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            firsts = []
            for table in self.tables:
                after = [at for at in table.result_times() if at > since]
                if not after:
                    break
                firsts.append(after[0])
            else:
                return max(firsts)
            await asyncio.sleep(0.2)
        return None

    async def _inject_all(self) -> None:
        faults = schedule(self.opts.seed, self.opts.kinds, len(self.tables))
        per_cycle = len(self.opts.kinds)
        while True:
            done = len(self.outcomes)
            if self.opts.max_faults and done >= self.opts.max_faults:
                return
            cycle_done = done and done % per_cycle == 0 and done // per_cycle >= self.opts.cycles
            if not self.opts.max_faults and cycle_done and self.settled_rounds() >= self.opts.rounds:
                return
            fault = next(faults)
            outcome = Outcome(fault)
            self.outcomes.append(outcome)
            try:
                await self._inject(fault, outcome)
            except Exception as error:  # a fault the harness could not apply or heal: reported, run goes on
                outcome.error = f"{type(error).__name__}: {error}"
                self.say(f"  fault {fault.n} {fault.kind}: ERROR {outcome.error}")
                await asyncio.to_thread(self._heal_all)
            if not outcome.healed_at:
                outcome.healed_at = time.monotonic()
            recovered = await self._wait_play(outcome.healed_at, RECOVERY_S)
            outcome.survived = recovered is not None and not outcome.error
            outcome.recovered_at = recovered or time.monotonic()
            outcome.stall_s = self._stall(outcome.injected_at or outcome.healed_at, outcome.recovered_at)
            if fault.kind == "kill_wallet" and outcome.survived:
                outcome.wallet_applies_after_s = await self._wallet_applies_after(outcome.healed_at)
                outcome.detail += f", applies settlements {outcome.wallet_applies_after_s:.1f}s after serving"
            status = "survived" if outcome.survived else "NOT SURVIVED"
            self.say(
                f"  fault {fault.n} {fault.kind} {outcome.detail}: {status}, longest stall {outcome.stall_s:.1f}s"
                f" ({self.settled_rounds()} rounds settled)"
            )

    async def _wallet_applies_after(self, serving_at: float) -> float:
        """Seconds from the wallet serving again until it had applied a round settled after that."""
        assert self.clients is not None
        deadline = time.monotonic() + RECOVERY_S
        while time.monotonic() < deadline:
            ended = [(rid, at, st) for t in self.tables for rid, (at, st) in t.ended.items()]
            later = [rid for rid, at, st in ended if at > serving_at and st == "settled"]
            for round_id in later[:3]:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await self.clients.wallet.GetRoundSettlement(
                        wallet_pb2.GetRoundSettlementRequest(round_id=round_id), metadata=self.admin(), timeout=5
                    )
                    return round(time.monotonic() - serving_at, 2)
            await asyncio.sleep(0.2)
        return round(time.monotonic() - serving_at, 2)

    def _stall(self, start: float, end: float) -> float:
        """The longest time without a round ending at any table, around [start, end]."""
        worst = 0.0
        for table in self.tables:
            times = table.result_times()
            before = [t for t in times if t <= start]
            points = [before[-1] if before else start, *(t for t in times if start < t <= end)]
            if points[-1] < end:
                points.append(end)
            worst = max(worst, *(b - a for a, b in itertools.pairwise(points)), 0.0)
        return round(worst, 2)

    async def _await_trigger(self, fault: Fault) -> None:
        """The chosen phase of the chosen round of the chosen table (or the wait's end)."""
        table = self.tables[fault.table]
        hit = asyncio.Event()
        opened = [0]

        def listener(update: table_pb2.TableUpdate) -> None:
            k = kind(update)
            if k == "round_opened":
                opened[0] += 1
            if opened[0] >= fault.rounds_ahead and k == fault.trigger:
                hit.set()

        table.listen(listener)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hit.wait(), TRIGGER_WAIT_S)
        finally:
            table.unlisten(listener)
        await asyncio.sleep(fault.delay_s)

    async def _inject(self, fault: Fault, outcome: Outcome) -> None:
        svc, infra = self.svc, self.infra
        if fault.kind == "replica_takeover":
            standby = await asyncio.to_thread(svc.add_replica, "table")
            outcome.detail = f"standby {standby.name}"
        await self._await_trigger(fault)
        outcome.injected_at = time.monotonic()
        k = fault.kind
        if k.startswith("kill_"):
            name = await self._victim(k.removeprefix("kill_"), fault)
            svc.kill(name)
            serving = await asyncio.to_thread(lambda: (svc.start(name, wait=False), svc.wait_healthy(name))[1])
            outcome.detail = f"{name} serving again after {serving:.1f}s"
        elif k == "sigstop":
            name = await self._victim(fault.target, fault)
            svc.pause(name)
            await asyncio.sleep(fault.duration_s)
            svc.resume(name)
            outcome.detail = f"{name} stopped {fault.duration_s:.1f}s"
        elif k == "replica_takeover":
            owner = await asyncio.to_thread(self._table_owner, self.tables[fault.table].table_id)
            svc.kill(owner)
            spare = next(i.name for i in svc.replicas("table") if i.name not in svc.slots["table"])
            svc.retire(owner, spare)  # the spare takes the owner's slot (if the spare was the owner: no slot)
            outcome.detail = f"owner {owner} killed; table replicas now {', '.join(svc.slots['table'])}"
        elif k == "kafka_restart":
            await asyncio.to_thread(infra.stop_kafka)
            await asyncio.to_thread(infra.start_kafka)
            outcome.detail = f"broker back after {time.monotonic() - outcome.injected_at:.1f}s"
        elif k == "postgres_restart":
            await asyncio.to_thread(infra.pg_immediate_stop)
            await asyncio.sleep(fault.duration_s)
            await asyncio.to_thread(infra.pg_start)
            outcome.detail = f"down {time.monotonic() - outcome.injected_at:.1f}s"
        elif k == "redis_wipe":
            await asyncio.to_thread(infra.redis_kill)
            await asyncio.sleep(fault.duration_s)
            await asyncio.to_thread(infra.redis_start)
            outcome.detail = f"down {time.monotonic() - outcome.injected_at:.1f}s"
        elif k in ("slow_link", "cut_link"):
            proxies = self._link_proxies(fault.target)
            for proxy in proxies:
                if k == "slow_link":
                    proxy.delay(fault.amount)
                else:
                    await asyncio.to_thread(proxy.cut)
            await asyncio.sleep(fault.duration_s)
            for proxy in proxies:
                proxy.delay(0)
                proxy.restore()
            what = f"+{fault.amount}ms" if k == "slow_link" else "cut"
            outcome.detail = f"{fault.target} {what} for {fault.duration_s:.1f}s"
        elif k == "clock_forward":
            svc.move_clock(fault.amount)
            outcome.detail = f"+{fault.amount // 3600}h (now +{svc.clock_offset_s // 3600}h)"
        else:
            raise ValueError(f"unknown fault kind {k}")
        outcome.healed_at = time.monotonic()

    def _heal_all(self) -> None:
        """After a fault that failed half-way: every link restored, every process running again."""
        svc, infra = self.svc, self.infra
        for proxy in svc.links().values():
            proxy.delay(0)
            proxy.restore()
        for inst in list(svc.instances.values()):
            with contextlib.suppress(Exception):
                if inst.stopped:
                    svc.resume(inst.name)
                if not inst.alive():
                    svc.start(inst.name)
        for step in (infra.wait_kafka, infra.pg_start, infra.redis_start):
            try:
                step()
            except Exception as error:  # already running, or cannot be helped: the checks will tell
                self.say(f"  heal: {step.__name__}: {type(error).__name__}: {error}")

    async def _victim(self, service: str, fault: Fault) -> str:
        """The replica a fault hits: the table's owner of the fault's table, else a slot drawn by the fault."""
        if service == "table":
            return await asyncio.to_thread(self._table_owner, self.tables[fault.table].table_id)
        return self.svc.slot_of(service, fault.n)

    def _link_proxies(self, link: str) -> list[Any]:
        service, dep = link.split("->")
        if service == "all":
            return [self.svc.links()[link]]
        # Every live replica's link to the dependency (to each replica of a service it calls).
        return [p for i in self.svc.replicas(service) for d, p in i.proxies.items() if d.split("#")[0] == dep]

    def _table_owner(self, table_id: str) -> str:
        """The table instance holding the table's lease (from Redis), else the one clients are sent to."""
        import redis

        replicas = self.svc.replicas("table")
        try:
            client = redis.Redis.from_url(self.infra.env["REDIS_URL"], socket_timeout=2)
            try:
                for key in client.scan_iter(match=f"niuniu:lease:*{table_id}", count=1000):
                    value = client.get(key)
                    holder = value.decode() if isinstance(value, bytes) else str(value)
                    for inst in replicas:
                        if re.search(rf"-{inst.pid}-", holder):
                            return inst.name
            finally:
                client.close()
        except redis.RedisError:
            pass
        return self.svc.slot_of("table", 0)

    # -- drain and checks ---------------------------------------------------------------------------

    async def _balances(self, c: Clients) -> dict[str, tuple[int, int]]:
        balances: dict[str, tuple[int, int]] = {}
        token = ""
        while True:
            page = await c.wallet.ListBalances(
                wallet_pb2.ListBalancesRequest(page_size=500, page_token=token), metadata=self.auditor(), timeout=10
            )
            for b in page.balances:
                balances[b.account] = (b.available_minor, b.held_minor)
            token = page.next_page_token
            if not token:
                return balances

    async def _ledger_view(self, ledger: ledger_pb2_grpc.LedgerAsyncStub) -> tuple[int, dict[str, tuple[int, int]]]:
        trial = await ledger.TrialBalance(ledger_pb2.TrialBalanceRequest(), metadata=self.auditor(), timeout=10)
        rows: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for row in trial.rows:
            rows[row.account][0 if row.bucket == 1 else 1] += row.balance_minor
        return trial.imbalance_minor, {a: (v[0], v[1]) for a, v in rows.items() if any(v)}

    async def _drain(self, c: Clients, ledger: ledger_pb2_grpc.LedgerAsyncStub, since: float) -> None:
        """Bots stopped: every table ends a round opened after this; then holds and journal catch up."""
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            if all(
                any(at > since for at in t.opened.values()) and self._opened_rounds_ended(t, since) for t in self.tables
            ):
                break
            await asyncio.sleep(0.5)
        for table in self.tables:
            await self._close(c, table.table_id)
        # Closed, not just quiet: a table still playing can hold a banker's capital for its next round
        # at the moment the checks read the wallet.
        while time.monotonic() < deadline and not await self._all_closed(c):
            await asyncio.sleep(0.5)
        while time.monotonic() < deadline:
            with contextlib.suppress(grpc.aio.AioRpcError):
                wallet = await self._balances(c)
                imbalance, journal = await self._ledger_view(ledger)
                held = sum(h for _, h in wallet.values())
                if held == 0 and imbalance == 0 and journal == {a: v for a, v in wallet.items() if any(v)}:
                    self.say(f"drained in {time.monotonic() - since:.1f}s")
                    return
            await asyncio.sleep(1.0)
        self.say("drain: timed out (the checks will tell what is missing)")

    async def _close(self, c: Clients, table_id: str) -> None:
        """CloseTable, waited out like the bots' calls while the answer is retryable (bounded)."""
        request = table_pb2.CloseTableRequest(table_id=table_id)
        try:
            await retry(
                lambda: c.table.CloseTable(request, metadata=self.admin(), timeout=10),
                what="close",
                c=c,
                budget_s=CLOSE_BUDGET_S,
            )
        except grpc.aio.AioRpcError as error:
            self.say(f"close {table_id}: {error.code().name} {error.details()}")

    async def _all_closed(self, c: Clients) -> bool:
        for table in self.tables:
            try:
                info = await c.table.GetTable(
                    table_pb2.GetTableRequest(table_id=table.table_id), metadata=self.admin(), timeout=10
                )
            except grpc.aio.AioRpcError:
                return False
            if info.status != "closed":
                return False
        return True

    def _opened_rounds_ended(self, table: TableBots, since: float) -> bool:
        """Every round opened before ``since`` has a result."""
        return all(rid in table.ended for rid, at in table.opened.items() if at <= since)

    async def _check(self, c: Clients, ledger: ledger_pb2_grpc.LedgerAsyncStub) -> None:
        add = self.checks.append
        svc = self.svc
        # Every round settled or voided.
        unfinished: list[str] = []
        settled: list[tuple[str, str]] = []
        voided = 0
        for table in self.tables:
            for round_id in table.opened:
                try:
                    view = await c.table.GetRound(
                        table_pb2.GetRoundRequest(table_id=table.table_id, round_id=round_id),
                        metadata=self.admin(),
                        timeout=10,
                    )
                except grpc.aio.AioRpcError as error:
                    unfinished.append(f"{round_id}: {error.code().name}")
                    continue
                if view.phase == "settled":
                    settled.append((table.table_id, round_id))
                elif view.phase == "voided":
                    voided += 1
                elif round_id in table.ended or table.opened[round_id] < self._drain_cut(table):
                    unfinished.append(f"{round_id}: {view.phase}")
        add(
            Check(
                "rounds_settled_or_voided",
                not unfinished,
                f"{len(settled)} settled, {voided} voided, {len(unfinished)} unfinished {unfinished[:5]}",
            )
        )
        # Holds, conservation, ledger.
        try:
            wallet = await self._balances(c)
            held = {a: h for a, (_, h) in wallet.items() if h}
            open_holds: list[str] = []
            for account in list(held)[:5]:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    page = await c.wallet.ListHolds(
                        wallet_pb2.ListHoldsRequest(account=account), metadata=self.admin(), timeout=10
                    )
                    open_holds += [text_format.MessageToString(h, as_one_line=True) for h in page.holds]
            add(Check("holds_resolved", not held, f"{len(held)} accounts still hold money: {open_holds[:5]}"))
            total = sum(v + h for a, (v, h) in wallet.items() if a != EXTERNAL)
            external = sum(wallet.get(EXTERNAL, (0, 0)))
            add(
                Check(
                    "accounts_sum_to_deposits",
                    total == c.deposited_minor,
                    f"accounts {total}, deposits {c.deposited_minor}, cashier {external}",
                )
            )
            imbalance, journal = await self._ledger_view(ledger)
            live = {a: v for a, v in wallet.items() if any(v)}
            diff = sorted(a for a in set(journal) | set(live) if journal.get(a) != live.get(a))
            add(
                Check(
                    "ledger_balanced_and_equal_to_wallet",
                    imbalance == 0 and not diff,
                    f"imbalance {imbalance}, {len(diff)} accounts differ {diff[:5]}",
                )
            )
        except grpc.aio.AioRpcError as error:
            add(Check("wallet_and_ledger_readable", False, f"{error.code().name}: {error.details()}"))
        try:
            add(await asyncio.to_thread(self._audit_replay))
        except Exception as error:
            add(Check("audit_replay_clean", False, f"could not run: {type(error).__name__}: {error}"))
        try:
            add(await self._verify_rounds(settled))
        except Exception as error:
            add(Check("rounds_verify_from_seed", False, f"could not run: {type(error).__name__}: {error}"))
        add(self._no_early_cards())
        bad = {k: v for k, v in c.errors.items() if k.endswith((":INTERNAL", ":UNKNOWN"))}
        add(Check("clients_never_told_internal", not bad, f"{dict(bad)}; all refusals: {dict(c.errors)}"))
        add(self._replicas_worked())
        lost = [f"{o.fault.n}:{o.fault.kind}" for o in self.outcomes if not o.survived]
        detail = f"not survived: {lost}" if lost else f"{len(self.outcomes)} faults"
        add(Check("every_fault_survived", not lost, detail))
        del svc

    def _replicas_worked(self) -> Check:
        """Every replica in a slot at the end did each of its service's ``WORK_KINDS``."""
        self.work = self.svc.work()
        idle = [
            f"{name} {kind}"
            for service, kinds in WORK_KINDS.items()
            for name in self.svc.slots[service]
            for kind in kinds
            if not self.work[name][kind]
        ]
        done = "; ".join(
            f"{name} " + ", ".join(f"{kind} {n:.0f}" for kind, n in counts.items() if n)
            for name, counts in self.work.items()
        )
        return Check("every_replica_did_work", not idle, f"idle: {idle}; {done}")

    def _drain_cut(self, table: TableBots) -> float:
        """Rounds opened after the bots stopped may still be in play when the checks run."""
        return max(table.opened.values(), default=0.0)

    def _audit_replay(self) -> Check:
        svc = self.svc
        argv = ["replay", "--schema", svc.schema_of("ledger"), "--topic-prefix", svc.prefix]
        argv += ["--wallet", svc.addr("wallet"), "--dsn", self.infra.env["DATABASE_URL"], "--no-progress"]
        env = dict(os.environ)
        env["NIUNIU_AUDITOR_TOKEN"] = self.auditor()[0][1].removeprefix("Bearer ")
        audit = subprocess.run(
            [str(BIN / "niuniu-audit"), *argv], capture_output=True, text=True, timeout=900, env=env, check=False
        )
        text = audit.stdout + audit.stderr
        ok = audit.returncode == 0 and "RESULT: OK" in text
        summary = [line for line in text.splitlines() if re.match(r"\s*(differences|RESULT|events)", line)]
        return Check("audit_replay_clean", ok, "; ".join(summary) or text[-400:])

    async def _verify_rounds(self, settled: list[tuple[str, str]]) -> Check:
        from services.ledger import audit

        svc = self.svc
        failed: list[str] = []
        os.environ["NIUNIU_AUDITOR_TOKEN"] = self.auditor()[0][1].removeprefix("Bearer ")
        for _, round_id in settled:
            argv = [
                "verify-round",
                round_id,
                "--schema",
                svc.schema_of("ledger"),
                "--topic-prefix",
                svc.prefix,
                "--dsn",
                self.infra.env["DATABASE_URL"],
                "--table",
                svc.addr("table"),
            ]
            out, err = io.StringIO(), io.StringIO()
            code = await asyncio.to_thread(audit.main, argv, out=out, err=err)
            text = out.getvalue()
            if code != 0 or "RESULT: OK" not in text or "recompute: done" not in text:
                lines = (text + err.getvalue()).strip().splitlines()
                start = next((n for n, line in enumerate(lines) if line.startswith("findings:")), len(lines) - 3)
                failed.append(f"{round_id}: {' | '.join(lines[start : start + 4])}")
        return Check(
            "rounds_verify_from_seed",
            not failed and bool(settled),
            f"{len(settled) - len(failed)}/{len(settled)} verified {failed[:5]}",
        )

    def _no_early_cards(self) -> Check:
        """No update but a hand's reveal carries a card, and no hand is shown before its round reveals."""
        bad: list[str] = []
        count = 0
        for table in self.tables:
            revealing: set[str] = set()
            for arrival in table.arrivals:
                u = arrival.update
                count += 1
                k = kind(u)
                if k == "phase_changed" and u.phase_changed.phase == "revealing":
                    revealing.add(u.round_id)
                if k == "hand_revealed":
                    if u.round_id not in revealing:
                        bad.append(f"{table.table_id} {u.round_id}: hand before the reveal phase")
                elif k != "seed_revealed" and "cards:" in text_format.MessageToString(u):
                    bad.append(f"{table.table_id} {u.round_id}: {k} carried cards")
        return Check("no_card_before_reveal", not bad, f"{count} updates watched; {bad[:5]}")

    # -- report -----------------------------------------------------------------------------------

    def summary(self) -> dict[str, dict[str, Any]]:
        rows: dict[str, dict[str, Any]] = {}
        for k in self.opts.kinds:
            mine = [o for o in self.outcomes if o.fault.kind == k]
            rows[k] = {
                "injected": len(mine),
                "survived": sum(o.survived for o in mine),
                "longest_stall_s": max((o.stall_s for o in mine), default=0.0),
            }
        return rows

    def report(self) -> int:
        rows = self.summary()
        print(
            f"\nniuniu-chaos seed {self.opts.seed}: {self.settled_rounds()} rounds settled, "
            f"{len(self.outcomes)} faults",
            file=self.out,
        )
        print(f"{'fault kind':<18} {'injected':>8} {'survived':>8} {'longest stall':>14}", file=self.out)
        for k, row in rows.items():
            print(f"{k:<18} {row['injected']:>8} {row['survived']:>8} {row['longest_stall_s']:>13.1f}s", file=self.out)
        print("checks:", file=self.out)
        for check in self.checks:
            print(f"  {'OK  ' if check.ok else 'FAIL'} {check.name}: {check.detail}", file=self.out)
        ok = bool(self.checks) and all(ch.ok for ch in self.checks)
        print(f"RESULT: {'OK' if ok else 'FAILED'}", file=self.out, flush=True)
        if self.opts.report is not None:
            data = {
                "seed": self.opts.seed,
                "rounds_requested": self.opts.rounds,
                "rounds_settled": self.settled_rounds(),
                "tables": [
                    {"table_id": t.table_id, "variant": t.variant, "rounds_ended": len(t.ended)} for t in self.tables
                ],
                "kinds": rows,
                "faults": [
                    {
                        **asdict(o.fault),
                        "survived": o.survived,
                        "stall_s": o.stall_s,
                        "detail": o.detail,
                        "error": o.error,
                        "wallet_applies_after_s": o.wallet_applies_after_s,
                        "recovery_s": round(o.recovered_at - o.healed_at, 2) if o.recovered_at else None,
                    }
                    for o in self.outcomes
                ],
                "checks": [asdict(ch) for ch in self.checks],
                "replicas": dict(self.services.slots) if self.services is not None else {},
                "work": self.work,
                "ok": ok,
                "elapsed_s": round(time.monotonic() - self.started, 1),
            }
            self.opts.report.parent.mkdir(parents=True, exist_ok=True)
            self.opts.report.write_text(json.dumps(data, indent=2) + "\n")
        return 0 if ok else 1


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="niuniu-chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=100, help="settled rounds to play at least (default 100)")
    parser.add_argument("--seed", type=int, default=1, help="the schedule's seed (same seed, same schedule)")
    parser.add_argument("--faults", default=",".join(FAULT_KINDS), help="fault kinds, comma-separated (default all)")
    parser.add_argument(
        "--cycles", type=int, default=10, help="at least this many cycles, each injecting every kind once (default 10)"
    )
    parser.add_argument("--max-faults", type=int, default=0, help="stop after this many faults (default: whole cycles)")
    parser.add_argument("--tables-per-variant", type=int, default=2)
    parser.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    parser.add_argument("--run-dir", type=Path, default=None, help="the run's own infrastructure (default: temp)")
    parser.add_argument("--keep", action="store_true", help="keep the run dir (logs) afterwards")
    parser.add_argument("--print-schedule", type=int, default=0, metavar="N", help="print the first N faults and exit")
    args = parser.parse_args(argv)
    kinds = tuple(k.strip() for k in args.faults.split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown or not kinds:
        parser.error(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
    if args.rounds < 0 or args.tables_per_variant < 1 or args.cycles < 1:
        parser.error("--rounds must be >= 0, --tables-per-variant and --cycles >= 1")
    opts = Options(
        args.rounds,
        args.seed,
        kinds,
        args.tables_per_variant,
        args.report,
        args.run_dir,
        args.keep,
        args.max_faults,
        args.cycles,
    )
    if args.print_schedule:
        faults = schedule(opts.seed, opts.kinds, opts.tables_per_variant * len(VARIANTS))
        for _ in range(args.print_schedule):
            print(json.dumps(asdict(next(faults))))
        raise SystemExit(0)
    return opts


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through the clean-up: services stopped, our infrastructure down


def main(argv: Sequence[str] | None = None) -> None:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(Chaos(opts).run())


if __name__ == "__main__":
    main()
