"""The sealed archive on the real system: archive, prune, replay archive + Kafka, catch a changed segment.

Rounds of Golden Bull are played and the table closed; the journal is read. The topics' records are
sealed into a segment (``python -m tools.archive write``), Kafka's copies of them are deleted (as
retention would), and the stores are pruned of what the archive holds; the command prints each
store's hot tier before and after. ``niuniu-audit replay`` without the archive then refuses (Kafka
lost records), with it finds differences 0, and its journal is the journal read before pruning.
A segment changed by one byte, or missing, is reported by the audit (exit 1).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from kafka import TopicPartition
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from play import Watcher, connect, kind, settle_everything, total_money, update_is
from players import all_balances, register
from psycopg.conninfo import make_conninfo
from stack import BIN, ROOT, Stack

from backbone.archive import read_manifest, verify
from backbone.kafka import make_admin, make_consumer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 3
LIMITS = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=5_000,
    chips_minor=[100],
    betting_seconds=1,
    reveal_interval_ms=10,
    pause_between_rounds_ms=50,
)
JOURNAL = (
    'SELECT e.entry_id, e.event_id::text, e.kind, e.round_id, e.topic, e.partition, e."offset",'
    " array_agg(ARRAY[l.account, l.bucket, l.debit_minor::text, l.credit_minor::text] ORDER BY l.line_no)"
    " FROM journal_entries e JOIN journal_lines l USING (entry_id) GROUP BY 1, 2, 3, 4, 5, 6, 7 ORDER BY 1"
)


def store_dsn(stack: Stack, service: str) -> str:
    return make_conninfo(stack.infra["DATABASE_URL"], options=f"-csearch_path={stack.schema_of(service)}")


def journal(dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return list(conn.execute(JOURNAL).fetchall())


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)


def archive_tool(stack: Stack, archive: Path, command: str, *extra: str) -> subprocess.CompletedProcess[str]:
    services = ("rng", "table", "wallet", "ledger") if command != "verify" else ()
    stores = [arg for s in services for arg in ("--store", f"{s}={store_dsn(stack, s)}")]
    topics = ["--topic-prefix", stack.prefix] if command == "write" else []
    return run(sys.executable, "-m", "tools.archive", command, "--archive", str(archive), *stores, *topics, *extra)


def audit(stack: Stack, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = ["replay", "--schema", stack.schema_of("ledger"), "--topic-prefix", stack.prefix, "--no-progress"]
    argv += ["--wallet", stack.addr("wallet"), "--dsn", stack.infra["DATABASE_URL"]]
    return run(str(BIN / "niuniu-audit"), *argv, *extra)


def delete_archived_from_kafka(stack: Stack, archive: Path) -> None:
    """Delete Kafka's records the archive holds, as retention would once they are 30 days old."""
    (header,) = verify(archive).headers
    ends = {TopicPartition(p.topic, p.partition): p.end for p in header.partitions if p.end > 0}
    admin = make_admin(stack.infra["KAFKA_BOOTSTRAP_SERVERS"], "archive-e2e")
    try:
        admin.delete_records(ends)
    finally:
        admin.close()
    consumer = make_consumer(stack.infra["KAFKA_BOOTSTRAP_SERVERS"], None, "archive-e2e")
    try:
        assert consumer.beginning_offsets(list(ends)) == ends
    finally:
        consumer.close()


async def play_rounds_then_close(stack: Stack, table_id: str) -> None:
    async with connect(stack) as c:
        players = [await register(c, f"ar{i}x{stack.run_id}", 100_000) for i in range(2)]
        before = total_money(await all_balances(c))
        await c.table.CreateTable(
            table_pb2.CreateTableRequest(table_id=table_id, variant="golden_bull", limits=LIMITS), metadata=c.admin
        )
        watcher = Watcher(c, players[0], table_id)
        played: set[str] = set()
        for _ in range(ROUNDS):
            opened = await watcher.wait_for(lambda u: kind(u) == "round_opened" and u.round_id not in played)
            played.add(opened.round_id)
            for i, p in enumerate(players):
                request = table_pb2.PlaceBetRequest(
                    command_id=f"{opened.round_id}.{p.name}",
                    table_id=table_id,
                    area=f"area_{i + 1}",
                    amount_minor=300,
                    round_id=opened.round_id,
                )
                await c.table.PlaceBet(request, metadata=p.auth)
            await watcher.wait_for(update_is("result", opened.round_id))
        await c.table.CloseTable(table_pb2.CloseTableRequest(table_id=table_id), metadata=c.admin)
        while (await c.table.GetTable(table_pb2.GetTableRequest(table_id=table_id), metadata=c.admin)).status != (
            "closed"
        ):
            await asyncio.sleep(0.2)
        await settle_everything(c, players)
        assert total_money(await all_balances(c)) == before
        await watcher.stop()


def test_archive_prune_then_archive_and_kafka_replay_to_the_same_journal(stack: Stack, tmp_path: Path) -> None:
    asyncio.run(play_rounds_then_close(stack, "archive-1"))
    clean = audit(stack)  # also waits until Kafka holds the wallet's events: the journal is complete
    assert clean.returncode == 0 and "differences: 0" in clean.stdout, clean.stdout + clean.stderr
    ledger = store_dsn(stack, "ledger")
    before = journal(ledger)
    assert before, "no journal entries"

    archive = tmp_path / "archive"
    sealed = archive_tool(stack, archive, "write")
    assert sealed.returncode == 0 and "segment 1 sealed" in sealed.stdout, sealed.stdout + sealed.stderr
    head = sealed.stdout.split("head: ")[1].split()[0]
    delete_archived_from_kafka(stack, archive)

    pruned = archive_tool(stack, archive, "prune", "--older-than", "0")
    print(pruned.stdout)
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    for service in ("table", "wallet", "ledger"):
        assert f"{service} hot tier before" in pruned.stdout and f"{service} hot tier after" in pruned.stdout
    assert "its tracking rows stay" not in pruned.stdout, pruned.stdout
    with psycopg.connect(store_dsn(stack, "table")) as conn:
        # The archived rounds' events are gone from the hot tier, but each stream's last (its version).
        kept = conn.execute(
            "SELECT count(*) FROM events e WHERE correlation_id LIKE 'archive-1-r%%'"
            " AND version < (SELECT max(version) FROM events h WHERE h.stream_id = e.stream_id)"
        ).fetchone()
        assert kept == (0,), "archived rounds' events still hot"
        assert conn.execute("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL").fetchone() == (0,)
    assert "table: pruned 0 outbox rows, 0 events" not in pruned.stdout, pruned.stdout
    for service in ("wallet", "ledger"):
        with psycopg.connect(store_dsn(stack, service)) as conn:
            assert conn.execute("SELECT count(*) FROM processed_events").fetchone() == (0,), service

    lost = audit(stack, "--no-wallet")  # Kafka alone no longer holds the history
    assert lost.returncode == 2 and "no longer holds" in lost.stderr, lost.stdout + lost.stderr
    schema = f"archived_{stack.run_id}"
    kept_replay = ["--scratch-dsn", stack.infra["DATABASE_URL"], "--replay-schema", schema, "--keep"]
    replayed = audit(stack, "--archive", str(archive), "--archive-head", head, *kept_replay)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "differences: 0" in replayed.stdout and "1 segments verified" in replayed.stdout, replayed.stdout
    assert journal(make_conninfo(stack.infra["DATABASE_URL"], options=f"-csearch_path={schema}")) == before
    assert journal(ledger) == before

    with psycopg.connect(stack.infra["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')

    segment = archive / read_manifest(archive)[0].file
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x01
    segment.write_bytes(bytes(data))
    altered = audit(stack, "--archive", str(archive))
    assert altered.returncode == 1 and "segment 1 altered" in altered.stdout, altered.stdout + altered.stderr
    segment.unlink()
    missing = archive_tool(stack, archive, "verify")
    assert missing.returncode == 1 and "segment 1 missing" in missing.stdout, missing.stdout
