"""``python -m tools.takeover``: one replica of the table, of the wallet and of the ledger killed in turn under load.

It starts three replicas of the table, the wallet and the ledger (one of the rng) as ``niuniu-load --replicas``
does, opens ``--tables`` tables with short betting windows and keeps ``--in-flight`` PlaceBet calls going
(a call refused UNAVAILABLE or out of time is sent again with the same command id, as a client would, so
every bet the table recorded is known to the load). Then, for the table, the wallet and the ledger in turn, it
SIGKILLs the replica that owns the most (tables, and the partitions its relay and consumers hold by their
leases in Redis) and prints, from the kill:

- when everything the dead replica owned was owned again by a live replica;
- when the first bet was accepted in a round opened after the kill at a table that moved (the table);
  when the first record was applied on a partition that moved (the wallet's and the ledger's consumers);
- the calls sent meanwhile: how many, their p50 and p99 (a retried command counts once, first send to
  answer) and what was refused.

Then the bets stop, the rounds in play end, and the checks run: every accepted bet is recorded once with
the hold of its receipt, its round ended and it was settled or refunded; the wallet resolved its hold; the
ledger journaled its hold once and no movement of it twice; every table and partition ends owned by a live
replica; and ``niuniu-audit replay`` of the run's journal is clean. It prints each check and
``RESULT: OK`` (exit 0) or ``RESULT: FAILED`` (exit 1). Times are printed, never judged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
import redis
from niuniu.table.v1 import events_pb2 as table_events
from niuniu.table.v1 import table_pb2, table_pb2_grpc
from niuniu.wallet.v1 import wallet_pb2_grpc
from psycopg import sql

from backbone import tls
from backbone.auth import Role, Tokens, bearer
from backbone.config import DEFAULT_REDIS
from tools.load import (
    LEASE_KEY_PREFIX,
    MAX_PLAYERS,
    MAX_TABLES,
    STAKE_MINOR,
    LocalStack,
    Player,
    TableState,
    audit_replay,
    follow_tables,
    percentile,
    register_players,
)

KILLED = ("table", "wallet", "ledger")
REPLICAS = 3
LIMITS = table_events.TableLimits(
    min_bet_minor=100,
    max_bet_minor=1_000_000_000,
    chips_minor=[100],
    betting_seconds=3,
    reveal_interval_ms=100,
    pause_between_rounds_ms=300,
)
"""Short rounds: settlements reach the wallet's and the ledger's partitions every few seconds."""
CLOSING_MARGIN_MS = 150
CALL_TIMEOUT_S = 10.0
RETRY_ATTEMPTS = 6
RETRY_SLEEP_S = 0.3
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
POLL_S = 0.2
TAKEOVER_WAIT_S = 60.0
"""How long the run waits for what a killed replica owned to be owned and worked on again (then it goes on)."""
SETTLE_S = 3.0
"""Bets go on this long before the first kill and between one takeover and the next kill."""
DRAIN_S = 90.0


@dataclass
class Receipt:
    bet_id: str
    hold_id: str
    table_id: str
    round_id: str
    accepted_at: float  # wall clock


@dataclass
class Command:
    sent_at: float  # wall clock, first send
    ms: float  # first send to the last answer
    outcome: str  # "accepted", or the last refusal's status and reason


@dataclass
class Bettor:
    """``in_flight`` PlaceBet calls at the tables taking bets; each command retried while UNAVAILABLE."""

    table: Any
    players: list[Player]
    states: list[TableState]
    in_flight: int
    receipts: dict[str, Receipt] = field(default_factory=dict)
    commands: list[Command] = field(default_factory=list)
    unknown: int = 0  # commands still unanswered after every retry: the table may have recorded them
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        await asyncio.gather(*(self._worker() for _ in range(self.in_flight)))

    async def _worker(self) -> None:
        rng = random.Random()
        while not self.stop.is_set():
            now_ms = time.time() * 1000
            open_now = [s for s in self.states if s.betting and s.closes_at_ms - CLOSING_MARGIN_MS > now_ms]
            if not open_now:
                await asyncio.sleep(0.02)
                continue
            state, player = rng.choice(open_now), rng.choice(self.players)
            request = table_pb2.PlaceBetRequest(
                command_id=uuid.uuid4().hex,
                table_id=state.table_id,
                area=rng.choice(state.areas),
                amount_minor=STAKE_MINOR,
                round_id=state.round_id,
            )
            await self._place(state, player, request)

    async def _place(self, state: TableState, player: Player, request: Any) -> None:
        sent_at, started = time.time(), time.perf_counter()
        outcome = ""
        for attempt in range(RETRY_ATTEMPTS):
            try:
                receipt = await self.table.PlaceBet(request, metadata=player.auth, timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as error:
                outcome = f"{error.code().name}:{(error.details() or '').split(':', 1)[0][:40]}"
                if error.code() in RETRIED and attempt + 1 < RETRY_ATTEMPTS:
                    await asyncio.sleep(RETRY_SLEEP_S)
                    continue
                if error.code() in RETRIED:
                    self.unknown += 1
                elif error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    state.betting = False  # the follower looks again
                break
            self.receipts[receipt.bet_id] = Receipt(
                receipt.bet_id, receipt.hold_id, state.table_id, receipt.round_id, time.time()
            )
            outcome = "accepted"
            break
        self.commands.append(Command(sent_at, (time.perf_counter() - started) * 1000, outcome))

    def calls_between(self, start: float, end: float) -> list[Command]:
        return [c for c in self.commands if start <= c.sent_at <= end]


# ------------------------------------------------------------------------------------------ ownership


def owner_pid(value: bytes | str | None) -> int | None:
    """The process id in a lease's value (``<host>-<pid>-<context>|<token>``)."""
    if value is None:
        return None
    owner = (value.decode() if isinstance(value, bytes) else value).rpartition("|")[0]
    parts = owner.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def ownership(stack: LocalStack, service: str, table_ids: list[str]) -> dict[str, str]:
    """Every lease of ``service`` held now -> the replica holding it (or ``?``): its tables (the table)
    and the partitions of its relay and consumers (``relay:...:<schema>:<topic>:<partition>``)."""
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", DEFAULT_REDIS), socket_timeout=5)
    try:
        keys = [str(k.decode()) for k in client.scan_iter(match=f"{LEASE_KEY_PREFIX}*:{stack.schema(service)}:*")]
        if service == "table":
            keys += [f"{LEASE_KEY_PREFIX}table:{stack.topic_prefix}{t}" for t in table_ids]
        values = client.mget(keys) if keys else []
    finally:
        client.close()
    names = stack.replica_pids()
    return {
        key.removeprefix(LEASE_KEY_PREFIX): names.get(owner_pid(value) or 0, "?")
        for key, value in zip(keys, values, strict=True)
        if value is not None
    }


def alive(stack: LocalStack) -> set[str]:
    return {name for pid, name in stack.replica_pids().items() if _running(stack, pid)}


def _running(stack: LocalStack, pid: int) -> bool:
    return any(p.pid == pid and p.poll() is None for procs in stack.procs.values() for p in procs)


def moved_parts(keys: list[str]) -> list[str]:
    """The consumers' partitions among lease names, as ``<consumer>:<topic>:<partition>`` (processed_events)."""
    out = []
    for key in keys:
        kind, group, _schema, topic, partition = (key.split(":") + [""] * 5)[:5]
        if kind == "consumer" and partition.isdigit():
            out.append(f"{group.rsplit('.', 1)[-1]}:{topic}:{partition}")
    return out


# ------------------------------------------------------------------------------------------ takeovers


@dataclass
class Takeover:
    service: str
    victim: str
    moved: list[str]  # the leases the victim held (tables, partitions)
    owned_again_s: float | None = None
    first_work_s: float | None = None
    calls: list[Command] = field(default_factory=list)

    @property
    def tables(self) -> list[str]:
        return [key for key in self.moved if key.startswith("table:")]

    def line(self) -> str:
        parts = len(self.moved) - len(self.tables)
        what = f"{len(self.tables)} tables, {parts} partitions" if self.tables else f"{parts} partitions"
        owned = _seconds(self.owned_again_s, "owned again after", f"not all owned again in {TAKEOVER_WAIT_S:.0f} s")
        work = "first bet accepted on a moved table" if self.service == "table" else "first record applied on a moved"
        work += "" if self.service == "table" else " partition"
        first = _seconds(self.first_work_s, f"{work} after", f"{work}: none in {TAKEOVER_WAIT_S:.0f} s")
        ms = [c.ms for c in self.calls]
        refused = Counter(c.outcome for c in self.calls if c.outcome != "accepted")
        calls = f"{len(ms)} calls, p50 {percentile(ms, 50):.1f} ms, p99 {percentile(ms, 99):.1f} ms"
        calls += f", max {max(ms, default=float('nan')):.1f} ms"
        calls += "; refused " + (", ".join(f"{k} {n}" for k, n in refused.most_common(4)) or "none")
        return f"takeover: {self.victim} killed (it owned {what}): {owned}; {first}\n  during it: {calls}"


def _seconds(value: float | None, said: str, otherwise: str) -> str:
    return f"{said} {value:.1f} s" if value is not None else otherwise


@dataclass
class TakeoverRun:
    """The load, the kills in turn, the drain and the checks of one takeover run."""

    stack: LocalStack
    bettor: Bettor
    out: Any
    takeovers: list[Takeover] = field(default_factory=list)
    leases_before: dict[str, set[str]] = field(default_factory=dict)

    @property
    def table_ids(self) -> list[str]:
        return [s.table_id for s in self.bettor.states]

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    async def kill_in_turn(self) -> None:
        for service in KILLED:
            await asyncio.sleep(SETTLE_S)
            takeover = await self.take_over(service)
            self.takeovers.append(takeover)
            self.say(takeover.line())

    async def take_over(self, service: str) -> Takeover:
        """SIGKILL the replica of ``service`` that owns the most; wait until what it owned is owned and worked on."""
        stack = self.stack
        before = await asyncio.to_thread(ownership, stack, service, self.table_ids)
        self.leases_before.setdefault(service, set()).update(before)
        held = Counter(before.values())
        names = stack.replica_names(service)
        victim = max(names, key=lambda name: held[name])
        takeover = Takeover(service, victim, sorted(k for k, owner in before.items() if owner == victim))
        moved_tables = [k.removeprefix(f"table:{stack.topic_prefix}") for k in takeover.tables]
        proc = stack.procs[service][names.index(victim)]
        killed_at = time.time()
        proc.kill()
        await asyncio.to_thread(proc.wait)
        rounds_then = await self.current_rounds(moved_tables)
        deadline = time.monotonic() + TAKEOVER_WAIT_S
        while time.monotonic() < deadline and (takeover.owned_again_s is None or takeover.first_work_s is None):
            await asyncio.sleep(POLL_S)
            if takeover.owned_again_s is None:
                now, live = await asyncio.to_thread(ownership, stack, service, self.table_ids), alive(stack)
                if all(now.get(key) in live for key in takeover.moved):
                    takeover.owned_again_s = time.time() - killed_at
            if takeover.first_work_s is None:
                first = (
                    self.first_bet(moved_tables, rounds_then, killed_at)
                    if service == "table"
                    else await self.first_record(service, moved_parts(takeover.moved), killed_at)
                )
                takeover.first_work_s = None if first is None else max(0.0, first - killed_at)
        recovered = max(takeover.owned_again_s or 0.0, takeover.first_work_s or 0.0, 1.0)
        takeover.calls = self.bettor.calls_between(killed_at, killed_at + recovered)
        return takeover

    async def current_rounds(self, table_ids: list[str]) -> dict[str, str]:
        query = sql.SQL("SELECT table_id, coalesce(current_round_id, '') FROM {}.tables WHERE table_id = ANY(%s)")
        rows = await self._fetch(query.format(sql.Identifier(self.stack.schema("table"))), (table_ids,))
        return {str(t): str(r) for t, r in rows}

    def first_bet(self, table_ids: list[str], rounds_then: dict[str, str], since: float) -> float | None:
        """When the first bet was accepted in a round opened after ``since`` at one of ``table_ids``."""
        times = [
            r.accepted_at
            for r in list(self.bettor.receipts.values())
            if r.table_id in table_ids and r.accepted_at > since and r.round_id != rounds_then.get(r.table_id)
        ]
        return min(times, default=None)

    async def first_record(self, service: str, parts: list[str], since: float) -> float | None:
        """When a record was first applied on one of ``parts`` (``<consumer>:<topic>:<partition>``) after ``since``."""
        if not parts:
            return None
        query = sql.SQL(
            "SELECT extract(epoch FROM min(applied_at)) FROM {}.processed_events"
            " WHERE applied_at > to_timestamp(%s) AND consumer || ':' || topic || ':' || partition = ANY(%s)"
        ).format(sql.Identifier(self.stack.schema(service)))
        rows = await self._fetch(query, (since, parts))
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    async def _fetch(self, query: sql.Composed, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            cur = await conn.execute(query, params)
            return list(await cur.fetchall())

    # -------------------------------------------------------------------------------------- checks

    async def bet_checks(self) -> list[tuple[str, bool, str]]:
        """Every accepted bet recorded once, ended, its hold resolved and journaled once; nothing twice."""
        receipts = self.bettor.receipts
        bets, holds = sorted(receipts), sorted(r.hold_id for r in receipts.values())
        t, w, led = (sql.Identifier(self.stack.schema(s)) for s in ("table", "wallet", "ledger"))
        recorded = await self._fetch(
            sql.SQL(
                "SELECT b.bet_id, b.hold_id, b.status, r.phase FROM {}.bets b JOIN {}.rounds r USING (round_id)"
                " WHERE b.bet_id = ANY(%s)"
            ).format(t, t),
            (bets,),
        )
        by_bet = {str(row[0]): row for row in recorded}
        lost = [b for b in bets if b not in by_bet]
        other_hold = [b for b, row in by_bet.items() if row[1] != receipts[b].hold_id]
        unended = [b for b, row in by_bet.items() if row[2] not in ("settled", "refunded") or row[3] == "betting"]
        unknown = await self._fetch(
            sql.SQL("SELECT count(*) FROM {}.bets WHERE NOT bet_id = ANY(%s)").format(t), (bets,)
        )
        wallet = await self._fetch(
            sql.SQL("SELECT hold_id, status FROM {}.wallet_holds WHERE hold_id = ANY(%s)").format(w), (holds,)
        )
        unresolved = len(holds) - sum(1 for _, status in wallet if status != "open")
        twice_w = await self._fetch(
            sql.SQL(
                "SELECT hold_id, kind FROM {}.wallet_entries WHERE hold_id = ANY(%s)"
                " GROUP BY 1, 2 HAVING count(DISTINCT movement_id) > 1"
            ).format(w),
            (holds,),
        )
        journal = await self._fetch(
            sql.SQL(
                "SELECT hold_id, kind, count(*) FROM {}.journal_entries WHERE hold_id = ANY(%s) GROUP BY 1, 2"
            ).format(led),
            (holds,),
        )
        unjournaled = len(holds) - sum(1 for _, kind, _ in journal if kind == "hold")
        twice_j = [(h, k) for h, k, n in journal if n > 1]
        return [
            (
                "no accepted bet lost",
                not lost and not other_hold,
                f"{len(bets)} accepted, {len(lost)} not recorded,"
                f" {len(other_hold)} with another hold than their receipt's",
            ),
            ("every accepted bet settled or refunded", not unended, f"{len(unended)} not yet {unended[:3]}"),
            ("every hold resolved by the wallet", unresolved == 0, f"{unresolved} of {len(holds)} open or missing"),
            ("every hold journaled", unjournaled == 0, f"{unjournaled} of {len(holds)} without their hold entry"),
            (
                "nothing applied twice",
                not twice_w and not twice_j,
                f"wallet {len(twice_w)}, journal {len(twice_j)} holds with a movement twice {(twice_w + twice_j)[:3]}",
            ),
            (
                "no bet recorded that the load did not see accepted",
                int(unknown[0][0]) <= self.bettor.unknown,
                f"{unknown[0][0]} recorded without a receipt, {self.bettor.unknown} commands left unanswered",
            ),
        ]

    async def ownership_check(self) -> tuple[str, bool, str]:
        """Every table and partition leased before a kill is leased by a live replica now."""
        live, orphans = alive(self.stack), []
        for service, keys in self.leases_before.items():
            now = await asyncio.to_thread(ownership, self.stack, service, self.table_ids)
            orphans += [key for key in sorted(keys) if now.get(key) not in live]
        total = sum(len(keys) for keys in self.leases_before.values())
        return (
            "every table and partition owned by a live replica",
            not orphans,
            f"{total} leases, orphans {orphans[:4]}",
        )

    async def drain(self) -> list[tuple[str, bool, str]]:
        """Bets stopped: wait for the rounds, the wallet and the journal to catch up (bounded); the checks then."""
        deadline = time.monotonic() + DRAIN_S
        while True:
            checks = await self.bet_checks()
            if all(ok for _, ok, _ in checks) or time.monotonic() > deadline:
                return checks
            await asyncio.sleep(1.0)


def print_checks(checks: list[tuple[str, bool, str]], out: Any) -> bool:
    print("checks:", file=out)
    for name, ok, detail in checks:
        print(f"  {'OK  ' if ok else 'FAIL'} {name}: {detail}", file=out)
    return all(ok for _, ok, _ in checks)


def print_summary(takeovers: list[Takeover], out: Any) -> None:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} s"

    print(
        "kill to owned again: " + ", ".join(f"{t.service} {seconds(t.owned_again_s)}" for t in takeovers),
        file=out,
    )
    print(
        "kill to first work on what moved: " + ", ".join(f"{t.service} {seconds(t.first_work_s)}" for t in takeovers),
        file=out,
    )
    p99 = [percentile([c.ms for c in t.calls], 99) for t in takeovers if t.calls]
    if p99:
        print(
            f"p99 of the calls during the takeovers, ms (min / median / max): {min(p99):.1f} / "
            f"{statistics.median(p99):.1f} / {max(p99):.1f}",
            file=out,
        )


# ------------------------------------------------------------------------------------------ the session


async def create_tables(table: Any, admin: tuple[tuple[str, str]], count: int, tag: str) -> list[TableState]:
    states = []
    for i in range(count):
        request = table_pb2.CreateTableRequest(table_id=f"takeover-{tag}-{i}", variant="golden_bull", limits=LIMITS)
        info = await table.CreateTable(request, metadata=admin, timeout=CALL_TIMEOUT_S)
        states.append(TableState(info.table_id, list(info.areas), variant="golden_bull"))
    return states


async def session(args: argparse.Namespace, out: Any) -> int:
    tag = uuid.uuid4().hex[:6]
    stack = LocalStack(tag, Path(args.log_dir) / tag, REPLICAS, counts={"rng": 1})
    print(
        f"starting {REPLICAS} replicas of the table, the wallet and the ledger, one rng (logs in {stack.log_dir})",
        file=out,
        flush=True,
    )
    tokens = Tokens.development()
    try:
        await asyncio.to_thread(stack.start)
        options = tls.channel_options()
        async with (
            grpc.aio.insecure_channel(stack.addr("table"), options=options) as tch,
            grpc.aio.insecure_channel(stack.addr("wallet"), options=options) as wch,
        ):
            table = table_pb2_grpc.TableStub(tch)
            admin = bearer(tokens.issue("takeover-admin", Role.ADMIN))
            players = await register_players(wallet_pb2_grpc.WalletStub(wch), admin, args.players, tag)
            states = await create_tables(table, admin, args.tables, tag)
            print(
                f"{len(players)} players, {len(states)} tables; {args.in_flight} bets in flight", file=out, flush=True
            )
            run = TakeoverRun(stack, Bettor(table, players, states, args.in_flight), out)
            checks = await play(run, table, admin)
        clean = await asyncio.to_thread(audit_replay, stack, tokens, out)
        checks.append(("niuniu-audit replay clean", clean, "differences 0" if clean else "see above"))
        print_summary(run.takeovers, out)
        ok = print_checks(checks, out)
        print(f"RESULT: {'OK' if ok else 'FAILED'}", file=out, flush=True)
        return 0 if ok else 1
    finally:
        stack.stop()
        if not args.keep:
            await stack.drop()


async def play(run: TakeoverRun, table: Any, admin: tuple[tuple[str, str]]) -> list[tuple[str, bool, str]]:
    """Bets, the kills in turn, then the bets stop and the system drains: the checks."""
    stop_following = asyncio.Event()
    follower = asyncio.create_task(follow_tables(table, admin, run.bettor.states, stop_following))
    betting = asyncio.create_task(run.bettor.run())
    try:
        await run.kill_in_turn()
        await asyncio.sleep(SETTLE_S)
    finally:
        run.bettor.stop.set()
        await betting
    try:
        checks = await run.drain()
        checks.append(await run.ownership_check())
        return checks
    finally:
        stop_following.set()
        with contextlib.suppress(Exception):
            await follower


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.takeover", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=12)
    parser.add_argument("--players", type=int, default=24)
    parser.add_argument("--in-flight", type=int, default=6)
    parser.add_argument("--log-dir", default=".run/load")
    parser.add_argument("--keep", action="store_true", help="keep the run's schemas and topics")
    args = parser.parse_args(argv)
    if not (1 <= args.tables <= MAX_TABLES and 1 <= args.players <= MAX_PLAYERS and 1 <= args.in_flight <= 256):
        parser.error(f"--tables 1..{MAX_TABLES}, --players 1..{MAX_PLAYERS}, --in-flight 1..256")
    if "DATABASE_URL" not in os.environ:
        parser.error("DATABASE_URL must name the PostgreSQL (source .run/env)")
    return asyncio.run(session(args, sys.stdout))


if __name__ == "__main__":
    sys.exit(main())
