"""A restore drill on the real stack, with the scripts an operator runs (docs/runbooks/BackupAndRestore.md).

The wallet's and the table's databases live in a PostgreSQL cluster of the test's own (initdb on a
free port, WAL archived), never the shared one. Rounds of Golden Bull and Bai Buu are played, a base
backup taken (scripts/backup), more rounds played; then both services are killed and their cluster
destroyed, and restored from the backup to the backup's point (scripts/restore --to backup). Their
databases are now behind their topics: both refuse to start, saying why, and
``python -m backbone.recover check`` says the same. As designed (docs/decisions/0013), the cluster is
restored again from the same backup to the end of its WAL archive (--to end): the check passes, both
start, play goes on, ``niuniu-audit replay`` finds no difference and the accounts still sum to the
deposits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from play import (
    Watcher,
    audit_replay_is_clean,
    connect,
    kind,
    ledger_matches_wallet,
    settle_everything,
    total_money,
    update_is,
)
from players import Clients, Player, all_balances, register
from stack import BIN, ROOT, Stack, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RESTORED = ("wallet", "table")
TABLES = {"drill-gb": ("golden_bull", "area_1"), "drill-bb": ("bai_buu", "player_01")}
LIMITS = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=5_000,
    chips_minor=[100],
    betting_seconds=1,
    reveal_interval_ms=5,
    pause_between_rounds_ms=50,
)
DEPOSIT_MINOR = 100_000
REFUSAL_TIMEOUT_S = 60.0


def _pgbin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_basebackup"), key=lambda p: int(p.parent.parent.name))
    if not found:
        pytest.skip("no PostgreSQL binaries under /usr/lib/postgresql")
    return found[-1].parent


@dataclass
class Cluster:
    """A PostgreSQL cluster of the test's own: trust on loopback, WAL archived to ``archive``."""

    home: Path
    port: int
    bin: Path

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def archive(self) -> Path:
        return self.home / "wal-archive"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/drill"

    def as_owner(self, *argv: str) -> None:
        runner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*runner, *argv], check=True, capture_output=True, timeout=120)

    def options(self) -> list[str]:
        return ["--data-dir", str(self.data), "--port", str(self.port), "--user", "postgres"]

    def sql(self, query: str, database: str = "postgres") -> str:
        connection = ["-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", database]
        out = subprocess.run(
            [str(self.bin / "psql"), "-X", "-A", "-t", *connection, "-c", query],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.strip()

    def stop(self, mode: str = "fast") -> None:
        self.as_owner(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")


@contextlib.contextmanager
def scratch_cluster() -> Iterator[Cluster]:
    home = Path(tempfile.mkdtemp(prefix="niuniu-drill-", dir="/var/tmp"))
    cluster = Cluster(home, free_port(), _pgbin())
    if os.geteuid() == 0:
        shutil.chown(home, "postgres", "postgres")
    try:
        cluster.as_owner(str(cluster.bin / "initdb"), "-D", str(cluster.data), "-U", "postgres", "--auth=trust")
        cluster.as_owner("mkdir", str(cluster.archive))
        conf = (
            f"port = {cluster.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"
            "max_connections = 100\nwal_level = replica\narchive_mode = on\n"
            f"archive_command = 'test ! -f {cluster.archive}/%f && cp %p {cluster.archive}/%f'\n"
        )
        with (cluster.data / "postgresql.conf").open("a") as f:
            f.write(conf)
        log = str(home / "pg.log")
        cluster.as_owner(str(cluster.bin / "pg_ctl"), "-D", str(cluster.data), "-l", log, "-w", "start")
        cluster.sql("CREATE DATABASE drill")
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            cluster.stop("immediate")
        shutil.rmtree(home, ignore_errors=True)


@dataclass
class DrillStack(Stack):
    """The four services; the wallet and the table keep their databases in the scratch cluster."""

    scratch_dsn: str = ""

    def env(self, service: str) -> dict[str, str]:
        env = super().env(service)
        if service in RESTORED:
            env[f"NIUNIU_{service.upper()}_DSN"] = self.scratch_dsn
        return env

    def start_refused(self, service: str) -> str:
        """Start ``service`` expecting it to refuse: its exit status must be 2; returns its output."""
        proc = subprocess.run(
            [str(BIN / f"niuniu-{service}")],
            env=self.env(service),
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=REFUSAL_TIMEOUT_S,
        )
        assert proc.returncode == 2, f"{service} did not refuse (exit {proc.returncode}): {proc.stderr[-2000:]}"
        return proc.stderr

    def recover_check(self, service: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "backbone.recover", "check", service],
            env=self.env(service),
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=REFUSAL_TIMEOUT_S,
        )


def script(name: str, cluster: Cluster, *args: str) -> str:
    env = {**os.environ, "PGPASSWORD": ""}
    out = subprocess.run(
        [str(ROOT / "scripts" / name), *cluster.options(), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"scripts/{name} failed: {out.stderr}"
    return out.stdout.strip()


async def play_rounds(c: Clients, players: Sequence[Player], watchers: dict[str, Watcher], rounds: int) -> None:
    """``rounds`` rounds with bets on each table, each one's result seen."""

    async def table(table_id: str) -> None:
        area, watcher = TABLES[table_id][1], watchers[table_id]
        seen = {u.round_id for u in watcher.updates if kind(u) == "round_opened"}
        played = 0
        while played < rounds:
            opened = await watcher.wait_for(lambda u: kind(u) == "round_opened" and u.round_id not in seen)
            seen.add(opened.round_id)
            taken = 0
            for p in players:
                request = table_pb2.PlaceBetRequest(
                    command_id=f"{opened.round_id}.{p.name}",
                    table_id=table_id,
                    area=area,
                    amount_minor=200,
                    round_id=opened.round_id,
                )
                try:
                    await c.table.PlaceBet(request, metadata=p.auth)
                    taken += 1
                except grpc.aio.AioRpcError as error:  # a window closing under the bet
                    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
            if taken:
                await watcher.wait_for(update_is("result", opened.round_id))
                played += 1

    await asyncio.gather(*(table(t) for t in TABLES))
    await settle_everything(c, players)


def destroy(stack: DrillStack, cluster: Cluster) -> None:
    """The wallet and the table killed; their cluster's WAL archived to its last commit, then the cluster gone."""
    for service in RESTORED:
        stack.kill(service)
    segment = cluster.sql("SELECT pg_walfile_name(pg_switch_wal())")
    deadline = time.monotonic() + 30
    while cluster.sql("SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver") < segment:
        assert time.monotonic() < deadline, f"WAL segment {segment} was never archived"
        time.sleep(0.1)
    cluster.stop("immediate")
    shutil.rmtree(cluster.data)


def test_a_restore_behind_kafka_is_refused_then_recovered_and_everything_reconciles(infra: dict[str, str]) -> None:
    with scratch_cluster() as cluster:
        run_id = uuid.uuid4().hex[:8]
        stack = DrillStack(run_id, infra, ROOT / ".run" / "e2e" / run_id, scratch_dsn=cluster.dsn)
        try:
            stack.start_all()
            asyncio.run(drill(stack, cluster))
        finally:
            stack.stop_all()


async def drill(stack: DrillStack, cluster: Cluster) -> None:
    async with connect(stack) as c:
        money_before = total_money(await all_balances(c))
        players = [await register(c, f"rd{i}x{stack.run_id}", DEPOSIT_MINOR) for i in range(2)]
        for table_id, (variant, _) in TABLES.items():
            await c.table.CreateTable(
                table_pb2.CreateTableRequest(table_id=table_id, variant=variant, limits=LIMITS), metadata=c.admin
            )
        watchers = {t: Watcher(c, players[0], t) for t in TABLES}
        await play_rounds(c, players, watchers, 1)
        label = script("backup", cluster, "--label", "drill")
        assert label == "drill"
        await play_rounds(c, players, watchers, 1)
        await ledger_matches_wallet(c)

        await asyncio.to_thread(destroy, stack, cluster)
        script("restore", cluster, "--backup", "drill", "--to", "backup", "--start")
        for service in RESTORED:  # behind their topics: refused, with the reason and the way back
            refusal = await asyncio.to_thread(stack.start_refused, service)
            assert "its database is behind its topics" in refusal and "scripts/restore --to end" in refusal, refusal
            checked = await asyncio.to_thread(stack.recover_check, service)
            assert checked.returncode == 1 and "behind its topics" in checked.stdout, checked

        await asyncio.to_thread(cluster.stop)
        script("restore", cluster, "--backup", "drill", "--to", "end", "--start")
        for service in RESTORED:
            checked = await asyncio.to_thread(stack.recover_check, service)
            assert checked.returncode == 0, checked
            await asyncio.to_thread(stack.start, service)

        await play_rounds(c, players, watchers, 1)  # play goes on
        for watcher in watchers.values():
            await watcher.stop()
        for table_id in TABLES:
            await c.table.CloseTable(table_pb2.CloseTableRequest(table_id=table_id), metadata=c.admin)
        await settle_everything(c, players)
        await ledger_matches_wallet(c)
        await audit_replay_is_clean(stack)
        deposits = DEPOSIT_MINOR * len(players)
        assert total_money(await all_balances(c)) == money_before + deposits
