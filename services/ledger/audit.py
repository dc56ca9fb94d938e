"""``niuniu-audit``: rebuild the journal from Kafka and reconcile it; verify a round; benchmark the replay.

  niuniu-audit replay [--no-wallet] [--wallet HOST:PORT] [--username NAME] [--password-file F]
                      [--scratch-dsn DSN] [--keep] [--replay-schema NAME] [--workers N]
      Take the wallet's balances (ListBalances, each page exact as of a wallet event
      position), wait until Kafka holds every wallet event up to that position, rebuild
      the whole journal from offset 0 of the wallet and table topics into a scratch
      store, then compare it with the live journal entry by entry (ids, fields, lines),
      check both trial balances are zero, check each balances table against its lines,
      and compare every account with the wallet's balances at the same cut (the rebuilt
      journal as of the page's wallet position), so play going on meanwhile is never a
      difference. From the same events it reconciles the table with the wallet, round by
      round (services/ledger/settlements.py): every round the table ended must be applied
      by the wallet (a refusal is a difference), pass verify-round's checks against the
      wallet's movements, and every live bet's hold must be what the table's record needs.
      Prints a reconciliation report; progress goes to stderr. --workers N replays the partitions in
      N processes side by side (backbone/replay/workers.py), into the same scratch schema: the same journal.
      --archive DIR [--archive-head SHA256]: first verify the sealed archive (services/ledger/archived.py;
      an altered, missing or reordered segment is a difference), then replay its records before Kafka's.
  niuniu-audit verify-round ROUND [--table HOST:PORT] [--no-recompute]
                           [--wallet HOST:PORT] [--username NAME] [--password-file F]
      Show the round's journal and check it against the table's RoundSettled: every
      transfer has its movement, every hold of the round is resolved; then (unless
      --no-recompute) read the round's public record from the table as an auditor and
      re-deal and re-settle it from its revealed seed.
  niuniu-audit bench-replay [--events N] [--scratch-dsn DSN] [--workers 1,2,3 [--cpu-per-worker Q]]
      Replay speed (events/s) on N synthetic wallet and table events in scratch topics, into a
      scratch schema of --scratch-dsn (default NIUNIU_AUDIT_SCRATCH_DSN, then DATABASE_URL), with
      three rates measured in the same run: kafka-python alone reading and parsing the same records,
      Kafka's own consumer reading them (ConsumerPerformance), and pgbench's one-row INSERT commits.
      --workers: the same events replayed by each number of worker processes in turn (each held to
      --cpu-per-worker of a core in a CPU cgroup of its own: cgroup v1, as root), then the scaling
      line ``scaling: workers=1 <events/s>, workers=2 <events/s> (<ratio>x), ...``.

Connections come from the environment, each overridable by a flag: NIUNIU_AUDITOR_DSN
(a read-only role is enough; else NIUNIU_LEDGER_DSN or DATABASE_URL), NIUNIU_LEDGER_SCHEMA
or NIUNIU_DB_SCHEMA (the live journal's schema, default public), KAFKA_BOOTSTRAP_SERVERS
(as the auditor's principal NIUNIU_AUDITOR_KAFKA_USER: read-only ACLs suffice),
NIUNIU_TOPIC_PREFIX, NIUNIU_WALLET_ADDR (default 127.0.0.1:NIUNIU_WALLET_GRPC_PORT or 50053).

The scratch store: NIUNIU_AUDIT_SCRATCH_DSN / --scratch-dsn names a database of the
auditor's own (e.g. a local PostgreSQL) in which the replay gets a fresh schema, dropped
at the end. Without it the audit creates a database niuniu_audit_<time>_<hex> on the
live server (its role needs CREATEDB and nothing else: it owns only what it creates),
closed to PUBLIC, and drops it at the end (--keep keeps it, with the journal's plain indexes
built, which a replay only compared leaves out). A role that may not create databases falls
back to a schema in the live database (the report says so).

The wallet (replay) and the table (verify-round) are read with an auditor token obtained
by logging in through the wallet's Login: --username / NIUNIU_AUDITOR_USERNAME with
--password-file, NIUNIU_AUDITOR_PASSWORD or a prompt (an auditor account is made with
``python -m services.wallet.admin create --role auditor``), or NIUNIU_AUDITOR_TOKEN (a
token from an earlier Login). Only in development mode (NIUNIU_ENV=development,
development keys) is a token minted from the local issuer key when no login is given.
Where the services serve TLS (NIUNIU_TLS_CA_FILE), the audit's calls use it too,
presenting NIUNIU_TLS_CLIENT_CERT_FILE / NIUNIU_TLS_CLIENT_KEY_FILE when set.

Exit status: 0 everything reconciles; 1 a difference was found (each one is printed
with the entry or account and both values); 2 bad usage, or the audit could not be
completed (database, Kafka or a required wallet unreachable).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, TypeVar

import grpc
import psycopg
from kafka import TopicPartition
from niuniu.v1 import events_pb2
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from backbone import tls
from backbone.archive import Verified
from backbone.auth import DEVELOPMENT, ENV_MODE, Role, operator_token
from backbone.config import DEFAULT_KAFKA
from backbone.cpuquota import MIN_SHARE, unavailable_reason
from backbone.eventstore import build_envelope
from backbone.kafka import TopicSpec, ensure_topics, make_admin, make_consumer, make_producer, use_identity
from backbone.limits import Limit, kafka_consumer_rate, pgbench_commits
from backbone.replay import replay
from backbone.replay.model import ReplayGap, ReplayReport
from backbone.replay.reading import replay_consumer
from backbone.replay.scratch import build_indexes, plain_indexes
from backbone.replay.workers import MAX_REPLAY_WORKERS
from backbone.topics import Topics
from services.ledger import queries
from services.ledger.archived import ArchiveBroken, open_archive, print_archive
from services.ledger.projection import CONSUMER, JOURNAL
from services.ledger.recompute import recompute_via_table, table_address
from services.ledger.reconcile import (
    BalanceSource,
    Difference,
    GrpcWalletBalances,
    JournalComparison,
    WalletBalance,
    WalletComparison,
    WalletUnavailable,
    compare_balance_maps,
    compare_journals,
    compare_with_wallet,
)
from services.ledger.settlements import SettlementReconciler, SettlementReconciliation
from services.ledger.synthetic import SyntheticStream
from services.ledger.verify import RoundEvidence, journal_text, settlement_text, verify

EXIT_OK = 0
EXIT_DIFFERENCES = 1
EXIT_ERROR = 2

DEFAULT_DSN = "postgresql://niuniu@127.0.0.1:54329/niuniu_ledger"
DEFAULT_WALLET_PORT = 50053
DEFAULT_BENCH_EVENTS = 20_000
PROGRESS_STEP_PERCENT = 5
DEFAULT_CUT_TIMEOUT_S = 60.0
LOGIN_TIMEOUT_S = 10.0
SCRATCH_DATABASE_PREFIX = "niuniu_audit_"

PartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class AuditConfig:
    dsn: str
    kafka: str
    topics: Topics
    live_schema: str
    replay_schema: str
    keep_replay: bool = False
    # Where the replay is rebuilt: "" = a database created for it next to the live one.
    scratch_dsn: str = ""
    # How long to wait for Kafka to hold every wallet event up to the wallet's snapshot.
    cut_timeout_s: float = DEFAULT_CUT_TIMEOUT_S
    # Processes replaying the partitions side by side (1: the replay runs in this process).
    workers: int = 1
    # A sealed archive (backbone/archive.py) replayed before Kafka, and the head hash it must end at.
    archive: str = ""
    archive_head: str = ""


class AuditError(Exception):
    """The audit could not be completed (exit 2)."""


@dataclass
class AuditReport:
    replay: ReplayReport
    journal: JournalComparison
    live_trial: queries.TrialBalance
    replay_trial: queries.TrialBalance
    rejects: list[queries.RejectRecord]
    wallet: WalletComparison | None
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wallet_error: str = ""
    # The wallet event position the wallet comparison was made at (0: no wallet comparison).
    cut_position: int = 0
    scratch: str = ""
    settlements: SettlementReconciliation | None = None
    archive: Verified | None = None

    @property
    def ok(self) -> bool:
        return not self.differences and not self.wallet_error


# --- replay ----------------------------------------------------------------------------------------------


async def _connect(dsn: str, schema: str) -> psycopg.AsyncConnection:
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
    return conn


async def _replay_cut(conn: psycopg.AsyncConnection) -> dict[PartitionKey, int]:
    """The last offset the replay read, per partition."""
    cur = await conn.execute(
        'SELECT topic, partition, max("offset") FROM processed_events WHERE consumer = %s GROUP BY 1, 2', (CONSUMER,)
    )
    return {(str(r[0]), int(r[1])): int(r[2]) for r in await cur.fetchall()}


async def _live_positions(conn: psycopg.AsyncConnection) -> dict[PartitionKey, int]:
    """The next offset the live consumer will read, per partition."""
    cur = await conn.execute(
        "SELECT topic, partition, next_offset FROM consumer_positions WHERE consumer = %s", (CONSUMER,)
    )
    return {(str(r[0]), int(r[1])): int(r[2]) for r in await cur.fetchall()}


def _in_live_scope(replay_cut: dict[PartitionKey, int]) -> Callable[[queries.EntryRecord], bool]:
    return lambda e: e.partition < 0 or e.offset <= replay_cut.get((e.topic, e.partition), -1)


def _in_replay_scope(live_next: dict[PartitionKey, int]) -> Callable[[queries.EntryRecord], bool]:
    return lambda e: e.partition < 0 or e.offset < live_next.get((e.topic, e.partition), 0)


def _trial_differences(label: str, trial: queries.TrialBalance) -> list[Difference]:
    if trial.imbalance_minor == 0:
        return []
    return [
        Difference(
            "trial_balance",
            f"{label} journal",
            "total debits != total credits",
            str(trial.total_debit_minor),
            str(trial.total_credit_minor),
            "credits",
        )
    ]


def _reject_differences(live: list[queries.RejectRecord], replayed: list[queries.RejectRecord]) -> list[Difference]:
    found = [
        Difference(
            "rejects", f"entry {r.entry_id} (event {r.event_id})", f"movement refused: {r.reason}", "-", r.detail
        )
        for r in replayed
    ]
    live_keys = {(r.event_id, r.movement_index): r.reason for r in live}
    replay_keys = {(r.event_id, r.movement_index): r.reason for r in replayed}
    for key in sorted(set(live_keys) | set(replay_keys)):
        if live_keys.get(key) != replay_keys.get(key):
            found.append(
                Difference(
                    "rejects",
                    f"event {key[0]} movement {key[1]}",
                    "reject differs",
                    str(live_keys.get(key)),
                    str(replay_keys.get(key)),
                )
            )
    return found


async def audit_replay(
    config: AuditConfig,
    wallet: BalanceSource | None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> AuditReport:
    """Replay, then reconcile live vs replay vs wallet. ``wallet`` None skips the wallet comparison.

    The wallet's balances are taken first (each page exact as of a wallet position); the
    replay starts once Kafka holds every wallet event up to the highest of them, so the
    rebuilt journal as of each page's position is the consistent cut to compare with.
    """
    topic_names = [config.topics.wallet_events, config.topics.table_events]
    listed: dict[str, WalletBalance] | None = None
    wallet_error = ""
    if wallet is not None:
        try:
            listed = await wallet.balances()
        except WalletUnavailable as error:
            wallet_error = str(error)
    cut = max((b.as_of_position for b in (listed or {}).values()), default=0)
    archived, checked = (
        open_archive(config.archive, config.archive_head, topic_names) if config.archive else (None, None)
    )
    # Every wallet event below the archive's ``archived_below`` is in the archive (Kafka may have deleted them).
    floor = max((h.archived_below.get("wallet", 1) - 1 for h in checked.headers), default=0) if checked else 0
    if cut > floor:
        reached = await asyncio.to_thread(
            wait_for_wallet_position, config.kafka, config.topics.wallet_events, cut, config.cut_timeout_s
        )
        if reached < cut:
            raise AuditError(
                f"Kafka holds wallet events up to position {reached} only, {config.cut_timeout_s:.0f} s after the"
                f" wallet's snapshot at position {cut}: is the wallet's relay publishing?"
            )
    partitions = await asyncio.to_thread(partition_counts, config.kafka, topic_names)
    settlements = SettlementReconciler(config.topics.wallet_events, config.topics.table_events, partitions)
    async with scratch_store(config) as (scratch_dsn, scratch_label):
        replayed = await replay(  # the plain indexes only for a replay kept for inspection: nothing here reads them
            scratch_dsn,
            config.kafka,
            topic_names,
            JOURNAL,
            config.replay_schema,
            progress=progress,
            indexes=config.keep_replay,
            observe=settlements.observe,  # fed every event the replay reads
            workers=config.workers if config.workers > 1 else 0,
            archived=archived,
        )
        live_conn = await _connect(config.dsn, config.live_schema)
        replay_conn = await _connect(scratch_dsn, config.replay_schema)
        async with live_conn, replay_conn:
            report = await _reconcile(live_conn, replay_conn, replayed, listed)
    report.settlements = settlements.finish()
    report.differences.extend(report.settlements.differences)
    report.wallet_error = wallet_error
    report.cut_position = cut
    report.scratch = scratch_label
    report.archive = checked
    return report


@contextlib.asynccontextmanager
async def scratch_store(config: AuditConfig) -> AsyncIterator[tuple[str, str]]:
    """The DSN the replay writes to, and how to describe it; removed afterwards unless ``keep_replay``.

    ``config.scratch_dsn``: a fresh schema in that database. Otherwise a database created on
    the live server (CREATEDB is the only privilege it takes; the creator owns it), or, for
    a role that may not create databases, a schema in the live database.
    """
    if config.scratch_dsn:
        label = f"schema {config.replay_schema} of the scratch database {_dbname(config.scratch_dsn)}"
        async with _dropping_schema(config.scratch_dsn, config.replay_schema, config.keep_replay):
            yield config.scratch_dsn, label
        return
    name = f"{SCRATCH_DATABASE_PREFIX}{datetime.now(UTC):%Y%m%d%H%M%S}_{uuid.uuid4().hex[:6]}"
    async with await psycopg.AsyncConnection.connect(config.dsn, autocommit=True) as conn:
        try:
            await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.InsufficientPrivilege:
            created = False
        else:
            created = True
            await conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(name)))
    if not created:
        label = f"schema {config.replay_schema} of the live database (this role may not create a scratch database)"
        async with _dropping_schema(config.dsn, config.replay_schema, config.keep_replay):
            yield config.dsn, label
        return
    try:
        yield make_conninfo(config.dsn, dbname=name), f"database {name} (created for this audit, then dropped)"
    finally:
        if not config.keep_replay:
            async with await psycopg.AsyncConnection.connect(config.dsn, autocommit=True) as conn:
                await conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextlib.asynccontextmanager
async def _dropping_schema(dsn: str, schema: str, keep: bool) -> AsyncIterator[None]:
    try:
        yield
    finally:
        if not keep:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _dbname(dsn: str) -> str:
    return str(conninfo_to_dict(dsn).get("dbname", "?"))


def partition_counts(kafka: str, topics: Sequence[str]) -> dict[str, int]:
    """How many partitions each of ``topics`` has (0: the topic does not exist yet)."""
    consumer = make_consumer(kafka, None, "niuniu-audit-partitions")
    try:
        return {topic: len(consumer.partitions_for_topic(topic) or ()) for topic in topics}
    finally:
        consumer.close()


def wallet_position_in_kafka(kafka: str, topic: str) -> int:
    """The highest wallet store position among the last record of each partition of ``topic``.

    The relay publishes in store order, so every wallet event up to that position is in Kafka.
    """
    consumer = make_consumer(kafka, None, "niuniu-audit-cut")
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        firsts = consumer.beginning_offsets(parts) if parts else {}
        ends = {tp: int(o) for tp, o in consumer.end_offsets(parts).items() if int(o) > int(firsts[tp])}
        if not ends:
            return 0
        consumer.assign(list(ends))
        for tp, offset in ends.items():
            consumer.seek(tp, offset - 1)
        highest, pending = 0, set(ends)
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                for record in records:
                    if record.offset >= ends[tp] - 1:
                        highest = max(highest, int(events_pb2.EventEnvelope.FromString(record.value).store_position))
                        pending.discard(tp)
        return highest
    finally:
        consumer.close()


def wait_for_wallet_position(kafka: str, topic: str, position: int, timeout_s: float) -> int:
    """Wait until Kafka holds the wallet's events up to ``position``; returns the highest position seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = wallet_position_in_kafka(kafka, topic)
        if seen >= position or time.monotonic() >= deadline:
            return seen
        time.sleep(0.2)


async def _reconcile(
    live_conn: psycopg.AsyncConnection,
    replay_conn: psycopg.AsyncConnection,
    replayed: ReplayReport,
    listed: dict[str, WalletBalance] | None,
) -> AuditReport:
    replay_cut, live_next = await _replay_cut(replay_conn), await _live_positions(live_conn)
    live_scope, replay_scope = _in_live_scope(replay_cut), _in_replay_scope(live_next)
    journal = await compare_journals(
        queries.iter_entries(live_conn),
        queries.iter_entries(replay_conn),
        live_in_scope=live_scope,
        replayed_in_scope=replay_scope,
    )
    live_trial = await queries.trial_balance(live_conn, from_lines=True)
    replay_trial = await queries.trial_balance(replay_conn, from_lines=True)
    live_rejects, replay_rejects = await queries.rejects(live_conn), await queries.rejects(replay_conn)
    report = AuditReport(replayed, journal, live_trial, replay_trial, replay_rejects, None)
    report.differences.extend(journal.differences)
    report.differences.extend(_trial_differences("live", live_trial))
    report.differences.extend(_trial_differences("replayed", replay_trial))
    report.differences.extend(_reject_differences(live_rejects, replay_rejects))
    replay_balances = await queries.balances_table(replay_conn)
    for label, conn, table in (
        ("live", live_conn, await queries.balances_table(live_conn)),
        ("replayed", replay_conn, replay_balances),
    ):
        report.differences.extend(
            Difference(d.check, f"{label} {d.subject}", "balances table vs journal lines", d.live, d.other, "lines")
            for d in compare_balance_maps("balances", table, await queries.balances_from_lines(conn), "lines")
        )
    if journal.live_out_of_scope or journal.replayed_out_of_scope:
        report.notes.append(
            f"the live consumer and the replay saw different stream ends ({journal.live_out_of_scope} live entries "
            f"newer than the replay, {journal.replayed_out_of_scope} replayed entries the live consumer has not "
            "reached): those entries and the live-vs-replay balances were not compared"
        )
    else:
        live_balances = await queries.balances_table(live_conn)
        report.differences.extend(compare_balance_maps("balances", live_balances, replay_balances, "replay"))
    if listed is not None:
        report.wallet = compare_with_wallet(replay_balances, listed, await _replayed_as_of(replay_conn, listed))
        report.differences.extend(report.wallet.differences)
    return report


async def _replayed_as_of(
    replay_conn: psycopg.AsyncConnection, listed: dict[str, WalletBalance]
) -> dict[int, dict[tuple[str, str], int]]:
    """Each listed account's replayed balances as of its page's wallet position (the same cut on both
    sides), by position. One pass over the journal, whatever the number of pages: a trial balance as of
    each page's position read the whole journal once a page (1 000 accounts a page)."""
    cuts = {account: b.as_of_position for account, b in listed.items() if b.as_of_position > 0}
    as_of: dict[int, dict[tuple[str, str], int]] = {position: {} for position in cuts.values()}
    if not cuts:
        return as_of
    cur = await replay_conn.execute(
        "SELECT l.account, l.bucket, c.at, sum(l.credit_minor) - sum(l.debit_minor)"
        " FROM unnest(%s::text[], %s::bigint[]) AS c (account, at)"
        " JOIN journal_lines l ON l.account = c.account"
        " JOIN journal_entries e ON e.entry_id = l.entry_id AND e.wallet_position <= c.at"
        " GROUP BY 1, 2, 3",
        (list(cuts), list(cuts.values())),
    )
    for account, bucket, at, balance in await cur.fetchall():
        as_of[int(at)][str(account), str(bucket)] = int(balance)
    return as_of


def print_report(report: AuditReport, out: TextIO, *, wallet_skipped: bool) -> None:
    r, j = report.replay, report.journal
    rate = r.events_read / r.seconds if r.seconds else 0.0
    print("ledger audit: replay reconciliation", file=out)
    print(
        f"  replay     {r.events_read} events read, {r.events_applied} applied in {r.seconds:.2f} s"
        f" ({rate:.0f} events/s) into schema {r.schema}",
        file=out,
    )
    if report.scratch:
        print(f"  scratch    {report.scratch}", file=out)
    if report.archive is not None:
        print_archive(report.archive, out)
    print(
        f"  journal    live {j.live_entries} entries, replayed {j.replayed_entries}, compared {j.compared};"
        f" not compared: {j.live_out_of_scope} live, {j.replayed_out_of_scope} replayed",
        file=out,
    )
    for label, trial in (("live", report.live_trial), ("replayed", report.replay_trial)):
        print(
            f"  trial      {label:<8} {len(trial.rows)} account/buckets, debits {trial.total_debit_minor}"
            f" credits {trial.total_credit_minor} imbalance {trial.imbalance_minor}",
            file=out,
        )
    print(f"  rejects    {len(report.rejects)} movements refused by the journal", file=out)
    if report.settlements is not None:
        s = report.settlements
        print(
            f"  rounds     table vs wallet: {s.rounds_applied} applied, {s.rounds_refused} refused by the wallet,"
            f" {s.rounds_awaiting} awaiting its answer; {s.bets_compared} bets' holds compared",
            file=out,
        )
    if wallet_skipped:
        print("  wallet     skipped (--no-wallet)", file=out)
    elif report.wallet_error:
        print(f"  wallet     UNAVAILABLE: {report.wallet_error}", file=out)
    elif report.wallet is not None:
        not_listed = ", ".join(report.wallet.not_listed_by_wallet) or "none"
        print(
            f"  wallet     {report.wallet.accounts_compared} accounts compared"
            f" (system accounts the wallet does not list: {not_listed})",
            file=out,
        )
        if report.cut_position:
            print(
                f"  cut        the wallet's balances at wallet position {report.cut_position}, the replayed journal"
                " as of the same position (later events: not compared with the wallet)",
                file=out,
            )
    for note in report.notes:
        print(f"  note: {note}", file=out)
    print(f"differences: {len(report.differences)}", file=out)
    for difference in report.differences:
        print(f"  {difference}", file=out)
    print("RESULT: OK" if report.ok else "RESULT: FAILED", file=out)


class _Progress:
    """A percentage line on stderr, rewritten in place on a terminal."""

    def __init__(self, err: TextIO) -> None:
        self._err = err
        self._last = -PROGRESS_STEP_PERCENT
        self._tty = err.isatty()

    def __call__(self, read: int, total: int) -> None:
        percent = 100 * read // total if total else 100
        if percent - self._last < PROGRESS_STEP_PERCENT and percent < 100:
            return
        self._last = percent
        end = "\r" if self._tty and percent < 100 else "\n"
        print(f"replay: {percent:3d}% ({read}/{total} events)", end=end, file=self._err, flush=True)


async def _run_replay(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    config = AuditConfig(
        dsn=args.dsn,
        kafka=args.kafka,
        topics=Topics(args.topic_prefix),
        live_schema=args.schema,
        replay_schema=args.replay_schema or f"ledger_replay_{datetime.now(UTC):%Y%m%d%H%M%S}",
        keep_replay=args.keep,
        scratch_dsn=args.scratch_dsn,
        cut_timeout_s=args.cut_timeout,
        workers=args.workers,
        archive=args.archive,
        archive_head=args.archive_head,
    )
    wallet = None
    if not args.no_wallet:
        wallet = GrpcWalletBalances(args.wallet, await auditor_token(args, err))
    try:
        report = await audit_replay(config, wallet, progress=None if args.no_progress else _Progress(err))
    except AuditError as error:
        print(f"niuniu-audit: error: {error}", file=err)
        return EXIT_ERROR
    except ArchiveBroken as broken:
        print_archive(broken.checked, out)
        return EXIT_DIFFERENCES
    except ReplayGap as gap:
        print(f"niuniu-audit: error: {gap}", file=err)
        return EXIT_ERROR
    print_report(report, out, wallet_skipped=args.no_wallet)
    if report.differences:
        return EXIT_DIFFERENCES
    return EXIT_ERROR if report.wallet_error else EXIT_OK


async def login(address: str, username: str, password: str) -> str:
    """An auditor token from the wallet's Login (the role in the token is checked)."""
    from niuniu.wallet.v1 import wallet_pb2, wallet_pb2_grpc

    async with tls.aio_channel(address, None) as channel:
        try:
            reply = await wallet_pb2_grpc.WalletStub(channel).Login(
                wallet_pb2.LoginRequest(username=username, password=password), timeout=LOGIN_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as error:
            raise AuditError(f"login as {username} at {address}: {error.code().name}: {error.details()}") from None
    if reply.role != Role.AUDITOR.value:
        raise AuditError(f"{username} is a {reply.role or 'unknown role'} account, not an auditor")
    return str(reply.token)


async def auditor_token(args: argparse.Namespace, err: TextIO) -> str:
    """Login with the auditor's name and password; else NIUNIU_AUDITOR_TOKEN; else, in development only, minted."""
    if args.username:
        return await login(args.wallet, args.username, _password(args.password_file, args.username))
    token = os.environ.get("NIUNIU_AUDITOR_TOKEN", "")
    if token:
        return token
    if os.environ.get(ENV_MODE) == DEVELOPMENT:
        print("niuniu-audit: development mode: auditor token minted from the local issuer key", file=err)
        return operator_token(Role.AUDITOR, "audit")
    raise AuditError(
        "no auditor credentials: log in with --username (or NIUNIU_AUDITOR_USERNAME) and a password"
        " (--password-file, NIUNIU_AUDITOR_PASSWORD or the prompt), or set NIUNIU_AUDITOR_TOKEN; --no-wallet skips"
        " the wallet"
    )


def _password(path: str | None, username: str) -> str:
    if path:
        try:
            return Path(path).read_text().splitlines()[0]
        except (OSError, IndexError) as error:
            raise AuditError(f"cannot read a password from {path}: {error}") from None
    password = os.environ.get("NIUNIU_AUDITOR_PASSWORD", "")
    if password:
        return password
    if not sys.stdin.isatty():
        raise AuditError(f"no password for {username}: --password-file or NIUNIU_AUDITOR_PASSWORD")
    return getpass.getpass(f"password of {username}: ")


# --- verify-round ----------------------------------------------------------------------------------------


async def _run_verify_round(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    conn = await _connect(args.dsn, args.schema)
    async with conn:
        record = await queries.round_record(conn, args.round_id)
    evidence = RoundEvidence.of(record)
    try:
        step = None if args.no_recompute else recompute_via_table(args.table, await auditor_token(args, err))
    except AuditError as error:
        print(f"niuniu-audit: error: {error}", file=err)
        return EXIT_ERROR
    findings, recomputed = await verify(evidence, recompute=step)
    for line in [*journal_text(record), *settlement_text(evidence)]:
        print(line, file=out)
    print("recompute: " + ("done (deal and settlement from the revealed seed)" if recomputed else "skipped"), file=out)
    print(f"findings: {len(findings)}", file=out)
    for finding in findings:
        print(f"  {finding}", file=out)
    print("RESULT: OK" if not findings else "RESULT: FAILED", file=out)
    return EXIT_DIFFERENCES if findings else EXIT_OK


# --- bench-replay ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkersReport:
    """A replay of the benchmark's events by ``workers`` processes (``--workers``)."""

    workers: int
    replay: ReplayReport
    entries: int


@dataclass(frozen=True, slots=True)
class BenchReport:
    replay: ReplayReport  # as ``niuniu-audit replay`` replays: the journal's plain indexes not built
    entries: int
    indexes_seconds: float  # building those indexes afterwards, as a replay kept (``--keep``) builds them
    # Measured in the same run: kafka-python alone reading and parsing the same records (records/s,
    # with the replay's consumer settings), Kafka's own consumer reading them, and pgbench's one-row
    # INSERT commits (16 connections).
    kafka_parse_per_s: float
    kafka_read: Limit
    postgres: Limit
    # With ``--workers``: the same events replayed by each number of worker processes, instead of the above.
    by_workers: tuple[WorkersReport, ...] = ()


async def bench_replay(
    events: int, dsn: str, kafka: str, workers: Sequence[int] = (), cpu_per_worker: float = 0.0
) -> BenchReport:
    """Replay ``events`` synthetic events from scratch topics, with the same run's reference rates: in this
    process, or (``workers``) by each number of worker processes in turn, each held to ``cpu_per_worker``."""
    tag = uuid.uuid4().hex[:8]
    topics = Topics(f"bench{tag}.")
    specs = [TopicSpec(topics.wallet_events, partitions=6), TopicSpec(topics.table_events, partitions=6)]
    ensure_topics(kafka, specs)
    schema = f"ledger_bench_{tag}"
    names = [topics.wallet_events, topics.table_events]
    try:
        produced = _produce_synthetic(kafka, topics, events)
        by_workers = tuple([await _bench_workers(dsn, kafka, names, schema, n, cpu_per_worker) for n in workers])
        if by_workers:
            report, entries, indexes_seconds = by_workers[0].replay, by_workers[0].entries, float("nan")
        else:
            report = await replay(dsn, kafka, names, JOURNAL, schema, indexes=False)
            started = time.perf_counter()
            await build_indexes(dsn, schema, plain_indexes(JOURNAL))
            indexes_seconds = time.perf_counter() - started
            entries = await _entries(dsn, schema)
        kafka_rate = await asyncio.to_thread(kafka_parse_rate, kafka, names)
        kafka_read = await kafka_consumer_rate(kafka, produced)
        postgres = await pgbench_commits(dsn)
        return BenchReport(report, entries, indexes_seconds, kafka_rate, kafka_read, postgres, by_workers)
    finally:
        await _drop_schema(dsn, schema)
        admin = make_admin(kafka, "niuniu-audit-bench")
        try:
            admin.delete_topics([s.name for s in specs])
        finally:
            admin.close()


async def _bench_workers(
    dsn: str, kafka: str, names: Sequence[str], schema: str, workers: int, cpu_per_worker: float
) -> WorkersReport:
    """The benchmark's replay by ``workers`` processes, into a schema of its own (dropped afterwards)."""
    mine = f"{schema}_w{workers}"
    try:
        report = await replay(
            dsn, kafka, names, JOURNAL, mine, indexes=False, workers=workers, cpu_per_worker=cpu_per_worker
        )
        return WorkersReport(workers, report, await _entries(dsn, mine))
    finally:
        await _drop_schema(dsn, mine)


async def _entries(dsn: str, schema: str) -> int:
    conn = await _connect(dsn, schema)
    async with conn:
        cur = await conn.execute("SELECT count(*) FROM journal_entries")
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _drop_schema(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def kafka_parse_rate(kafka: str, topics: Sequence[str]) -> float:
    """Records/s kafka-python alone reads and parses (EventEnvelope) from offset 0 of ``topics``."""
    consumer = replay_consumer(kafka, "niuniu-audit-bench-kafka")
    try:
        parts = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        total = sum(consumer.end_offsets(parts).values())
        parse = events_pb2.EventEnvelope.FromString
        started, read = time.perf_counter(), 0
        while read < total:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    parse(record.value)
                read += len(records)
        return read / (time.perf_counter() - started)
    finally:
        consumer.close()


def _produce_synthetic(kafka: str, topics: Topics, events: int) -> dict[str, int]:
    """Send ``events`` synthetic events; how many went to each topic."""
    producer = make_producer(kafka, "niuniu-audit-bench", linger_ms=20, batch_size=256 * 1024)
    versions: dict[str, int] = {}
    now = datetime.now(UTC)
    sent = {topics.wallet_events: 0, topics.table_events: 0}
    try:
        for position, item in enumerate(SyntheticStream(seed=1, players=50).events(events), start=1):
            version = versions.get(item.stream_id, 0) + 1
            versions[item.stream_id] = version
            envelope = build_envelope(
                event_id=str(uuid.uuid4()),
                stream_id=item.stream_id,
                version=version,
                event=item.event,
                occurred_at=now,
                producer=item.target,
                store_position=position,
            )
            topic = topics.wallet_events if item.target == "wallet" else topics.table_events
            producer.send(topic, key=item.stream_id.encode(), value=envelope.SerializeToString())
            sent[topic] += 1
        producer.flush()
    finally:
        producer.close()
    return sent


def _run_bench(args: argparse.Namespace, out: TextIO) -> int:
    bench = _run_coroutine(
        bench_replay(args.events, args.scratch_dsn or args.dsn, args.kafka, args.workers, args.cpu_per_worker)
    )
    report, entries = bench.replay, bench.entries
    rate = report.events_read / report.seconds if report.seconds else 0.0
    print(f"ledger replay benchmark, {report.events_read} events ({entries} journal entries)", file=out)
    if bench.by_workers:
        _print_workers(bench.by_workers, args.cpu_per_worker, out)
    else:
        _print_in_process(bench, out)
    print(
        f"  kafka_parse_per_s        {bench.kafka_parse_per_s:10.0f}   (kafka-python alone, same records, same run;"
        f" replay = {100 * rate / bench.kafka_parse_per_s if bench.kafka_parse_per_s else 0.0:.0f} %)",
        file=out,
    )
    print(f"  kafka_read               {bench.kafka_read}", file=out)
    print(f"                           replay = {bench.kafka_read.ratio(rate)} of it", file=out)
    print(f"  postgres                 {bench.postgres}", file=out)
    if bench.by_workers:
        first = _rate(bench.by_workers[0].replay)
        print(
            "scaling: "
            + ", ".join(
                f"workers={w.workers} {_rate(w.replay):.0f} events/s"
                + (f" ({_rate(w.replay) / first:.2f}x)" if i and first else "")
                for i, w in enumerate(bench.by_workers)
            ),
            file=out,
        )
    return EXIT_OK


def _rate(report: ReplayReport) -> float:
    return report.events_read / report.seconds if report.seconds else 0.0


def _print_in_process(bench: BenchReport, out: TextIO) -> None:
    report, entries = bench.replay, bench.entries
    rate = _rate(report)
    print(f"  replay_seconds           {report.seconds:10.2f}   (as niuniu-audit replays: no plain index)", file=out)
    print(f"  replay_events_per_s      {rate:10.0f}", file=out)
    with_indexes = report.seconds + bench.indexes_seconds
    print(
        f"  plain_indexes_seconds    {bench.indexes_seconds:10.2f}   (built afterwards, as a kept replay builds them)",
        file=out,
    )
    print(f"  with_indexes_per_s       {report.events_read / with_indexes if with_indexes else 0.0:10.0f}", file=out)
    print(f"  entries_per_s            {entries / report.seconds if report.seconds else 0.0:10.0f}", file=out)


def _print_workers(by_workers: Sequence[WorkersReport], cpu_per_worker: float, out: TextIO) -> None:
    quota = f"{cpu_per_worker:g} of a core each" if cpu_per_worker else "no CPU quota"
    for w in by_workers:
        print(
            f"  workers={w.workers} ({quota}): replay_seconds {w.replay.seconds:.2f},"
            f" replay_events_per_s {_rate(w.replay):.0f}, {w.replay.events_read} events, {w.entries} entries",
            file=out,
        )


# --- command line ----------------------------------------------------------------------------------------


def _default_wallet_address() -> str:
    port = os.environ.get("NIUNIU_WALLET_GRPC_PORT", str(DEFAULT_WALLET_PORT))
    return os.environ.get("NIUNIU_WALLET_ADDR", f"127.0.0.1:{port}")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dsn",
        default=env.get("NIUNIU_AUDITOR_DSN") or env.get("NIUNIU_LEDGER_DSN") or env.get("DATABASE_URL") or DEFAULT_DSN,
        help="the ledger's PostgreSQL, read-only is enough (default: $NIUNIU_AUDITOR_DSN, $NIUNIU_LEDGER_DSN,"
        " $DATABASE_URL)",
    )
    common.add_argument(
        "--schema",
        default=env.get("NIUNIU_LEDGER_SCHEMA") or env.get("NIUNIU_DB_SCHEMA") or "public",
        help="schema of the live journal (default: $NIUNIU_LEDGER_SCHEMA, $NIUNIU_DB_SCHEMA or public)",
    )
    common.add_argument(
        "--kafka",
        default=env.get("KAFKA_BOOTSTRAP_SERVERS", DEFAULT_KAFKA),
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)",
    )
    common.add_argument(
        "--topic-prefix",
        default=env.get("NIUNIU_TOPIC_PREFIX", ""),
        help="topic name prefix (default: $NIUNIU_TOPIC_PREFIX)",
    )
    parser = argparse.ArgumentParser(
        prog="niuniu-audit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    credentials = argparse.ArgumentParser(add_help=False)
    credentials.add_argument(
        "--wallet", default=_default_wallet_address(), help="wallet gRPC address (default: $NIUNIU_WALLET_ADDR)"
    )
    credentials.add_argument(
        "--username",
        default=env.get("NIUNIU_AUDITOR_USERNAME", ""),
        help="log in to the wallet as this auditor (default: $NIUNIU_AUDITOR_USERNAME)",
    )
    credentials.add_argument("--password-file", help="the auditor's password: first line of this file")
    rep = commands.add_parser(
        "replay", parents=[common, credentials], help="rebuild the journal from Kafka and reconcile it"
    )
    rep.add_argument("--no-wallet", action="store_true", help="skip the comparison with the wallet's balances")
    rep.add_argument(
        "--scratch-dsn",
        default=env.get("NIUNIU_AUDIT_SCRATCH_DSN", ""),
        help="rebuild in a fresh schema of this database (default: $NIUNIU_AUDIT_SCRATCH_DSN, else a database"
        " created for the audit on the live server)",
    )
    rep.add_argument(
        "--cut-timeout",
        type=float,
        default=DEFAULT_CUT_TIMEOUT_S,
        help="seconds to wait for Kafka to hold the wallet's events up to its snapshot (default: 60)",
    )
    rep.add_argument("--replay-schema", default="", help="schema to rebuild into (default: ledger_replay_<time>)")
    rep.add_argument(
        "--keep",
        action="store_true",
        help="keep the scratch database (or schema) for inspection, with the journal's plain indexes built",
    )
    rep.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    rep.add_argument(
        "--archive",
        default=env.get("NIUNIU_ARCHIVE_DIR", ""),
        help="a sealed archive (python -m tools.archive): verified, then replayed before Kafka"
        " (default: $NIUNIU_ARCHIVE_DIR)",
    )
    rep.add_argument("--archive-head", default="", help="the SHA-256 the archive's newest segment must have")
    rep.add_argument(
        "--workers",
        type=_workers,
        default=1,
        help="processes replaying the partitions side by side (default 1: the replay runs in this process)",
    )
    ver = commands.add_parser(
        "verify-round", parents=[common, credentials], help="check a round's journal against its settlement"
    )
    ver.add_argument("round_id", metavar="ROUND")
    ver.add_argument("--table", default=table_address(), help="table gRPC address (default: $NIUNIU_TABLE_ADDR)")
    ver.add_argument("--no-recompute", action="store_true", help="check the journal only; do not re-deal the round")
    bench = commands.add_parser("bench-replay", parents=[common], help="replay speed on synthetic events")
    bench.add_argument("--events", type=int, default=DEFAULT_BENCH_EVENTS, help="how many events (default: 20000)")
    bench.add_argument(
        "--workers",
        type=_worker_counts,
        default=[],
        help="e.g. 1,2,3: replay the same events with each number of worker processes (default: in this process)",
    )
    bench.add_argument(
        "--cpu-per-worker",
        type=float,
        default=0.0,
        help="with --workers: hold each worker to this share of a core, in a CPU cgroup of its own (0: none)",
    )
    bench.add_argument(
        "--scratch-dsn",
        default=env.get("NIUNIU_AUDIT_SCRATCH_DSN") or env.get("DATABASE_URL", ""),
        help="database the benchmark's scratch schema is made in (default: $NIUNIU_AUDIT_SCRATCH_DSN,"
        " $DATABASE_URL; else --dsn)",
    )
    return parser


def _workers(text: str) -> int:
    try:
        workers = int(text)
    except ValueError:
        workers = 0
    if not 1 <= workers <= MAX_REPLAY_WORKERS:
        raise argparse.ArgumentTypeError(f"a whole number of processes 1..{MAX_REPLAY_WORKERS}, not {text!r}")
    return workers


def _worker_counts(text: str) -> list[int]:
    """``1,2,3`` -> [1, 2, 3]."""
    return [_workers(part.strip()) for part in text.split(",") if part.strip()]


T = TypeVar("T")


def _run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run``, also when called from a running event loop (then on a worker thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1) as worker:
        return worker.submit(asyncio.run, coroutine).result()


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse printed the usage (or --help)
        return exit_.code if isinstance(exit_.code, int) else EXIT_ERROR
    started = time.perf_counter()
    try:
        if args.command in ("replay", "verify-round"):
            use_identity("auditor")  # reads every system topic, writes none (NIUNIU_AUDITOR_KAFKA_USER)
        if args.command == "replay":
            code = _run_coroutine(_run_replay(args, out, err))
        elif args.command == "verify-round":
            if not args.round_id.strip():
                print("niuniu-audit: error: ROUND must not be empty", file=err)
                return EXIT_ERROR
            code = _run_coroutine(_run_verify_round(args, out, err))
        else:
            if args.events <= 0:
                print("niuniu-audit: error: --events must be positive", file=err)
                return EXIT_ERROR
            if args.cpu_per_worker and not (args.workers and MIN_SHARE <= args.cpu_per_worker <= 64):
                print(f"niuniu-audit: error: --cpu-per-worker {MIN_SHARE}..64 goes with --workers", file=err)
                return EXIT_ERROR
            if args.cpu_per_worker and (reason := unavailable_reason()):
                print(f"niuniu-audit: error: --cpu-per-worker: {reason}", file=err)
                return EXIT_ERROR
            code = _run_bench(args, out)
    except (psycopg.Error, OSError) as error:
        print(f"niuniu-audit: error: {type(error).__name__}: {error}", file=err)
        return EXIT_ERROR
    except AuditError as error:
        print(f"niuniu-audit: error: {error}", file=err)
        return EXIT_ERROR
    except Exception as error:  # Kafka client errors and the like: the audit could not run
        if type(error).__module__.startswith("kafka"):
            print(f"niuniu-audit: error: Kafka: {error}", file=err)
            return EXIT_ERROR
        raise
    print(f"({time.perf_counter() - started:.1f} s)", file=err)
    return code


if __name__ == "__main__":
    sys.exit(main())
