"""``niuniu-audit``: rebuild the journal from Kafka and reconcile it; verify a round; benchmark the replay.

  niuniu-audit replay [--no-wallet] [--wallet HOST:PORT] [--keep] [--replay-schema NAME]
      Rebuild the whole journal from offset 0 of the wallet and table topics into a fresh
      schema, then compare it with the live journal entry by entry (ids, fields, lines),
      check both trial balances are zero, check each balances table against its lines,
      and compare every account with the wallet's ListBalances. Prints a reconciliation
      report; progress goes to stderr.
  niuniu-audit verify-round ROUND
      Show the round's journal and check it against the table's RoundSettled: every
      transfer has its movement, every hold of the round is resolved.
  niuniu-audit bench-replay [--events N]
      Replay speed (events/s) on N synthetic wallet and table events in scratch topics.

Connections come from the environment, each overridable by a flag: NIUNIU_LEDGER_DSN
(or DATABASE_URL), NIUNIU_LEDGER_SCHEMA or NIUNIU_DB_SCHEMA (the live journal's schema,
default public),
KAFKA_BOOTSTRAP_SERVERS, NIUNIU_TOPIC_PREFIX, NIUNIU_WALLET_ADDR (default
127.0.0.1:NIUNIU_WALLET_GRPC_PORT or 50053), NIUNIU_AUDITOR_TOKEN or the issuer key
(NIUNIU_ISSUER_KEY_FILE; see backbone.auth.operator_token) for the auditor token.

Exit status: 0 everything reconciles; 1 a difference was found (each one is printed
with the entry or account and both values); 2 bad usage, or the audit could not be
completed (database, Kafka or a required wallet unreachable).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO, TypeVar

import psycopg
from kafka import TopicPartition
from psycopg import sql

from backbone.auth import Role, operator_token
from backbone.config import DEFAULT_KAFKA
from backbone.eventstore import build_envelope
from backbone.kafka import TopicSpec, ensure_topics, make_admin, make_consumer, make_producer, use_identity
from backbone.replay import ReplayReport, replay
from backbone.topics import Topics
from services.ledger import queries
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
from services.ledger.synthetic import SyntheticStream
from services.ledger.verify import RoundEvidence, journal_text, settlement_text, verify

EXIT_OK = 0
EXIT_DIFFERENCES = 1
EXIT_ERROR = 2

DEFAULT_DSN = "postgresql://niuniu@127.0.0.1:54329/niuniu_ledger"
DEFAULT_WALLET_PORT = 50053
DEFAULT_BENCH_EVENTS = 20_000
PROGRESS_STEP_PERCENT = 5

PartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class AuditConfig:
    dsn: str
    kafka: str
    topics: Topics
    live_schema: str
    replay_schema: str
    keep_replay: bool = False


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

    @property
    def ok(self) -> bool:
        return not self.differences and not self.wallet_error


# --- replay ----------------------------------------------------------------------------------------------


def end_offsets(kafka: str, topics: Sequence[str]) -> dict[PartitionKey, int]:
    consumer = make_consumer(kafka, None, "niuniu-audit-offsets")
    try:
        parts = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        return {(tp.topic, tp.partition): int(o) for tp, o in consumer.end_offsets(parts).items()} if parts else {}
    finally:
        consumer.close()


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
    """Replay, then reconcile live vs replay vs wallet. ``wallet`` None skips the wallet comparison."""
    topic_names = [config.topics.wallet_events, config.topics.table_events]
    ends_before = end_offsets(config.kafka, [config.topics.wallet_events])
    replayed = await replay(config.dsn, config.kafka, topic_names, JOURNAL, config.replay_schema, progress=progress)
    try:
        live_conn = await _connect(config.dsn, config.live_schema)
        replay_conn = await _connect(config.dsn, config.replay_schema)
        async with live_conn, replay_conn:
            report = await _reconcile(live_conn, replay_conn, replayed, wallet)
        if wallet is not None and end_offsets(config.kafka, [config.topics.wallet_events]) != ends_before:
            report.notes.append("wallet events arrived during the audit: wallet differences may be timing; rerun")
        return report
    finally:
        if not config.keep_replay:
            async with await psycopg.AsyncConnection.connect(config.dsn, autocommit=True) as conn:
                await conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(config.replay_schema))
                )


async def _reconcile(
    live_conn: psycopg.AsyncConnection,
    replay_conn: psycopg.AsyncConnection,
    replayed: ReplayReport,
    wallet: BalanceSource | None,
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
    if wallet is not None:
        try:
            listed = await wallet.balances()
        except WalletUnavailable as error:
            report.wallet_error = str(error)
        else:
            report.wallet = compare_with_wallet(
                replay_balances, listed, await _replayed_as_of(replay_conn, listed, report)
            )
            report.differences.extend(report.wallet.differences)
    return report


async def _replayed_as_of(
    replay_conn: psycopg.AsyncConnection, listed: dict[str, WalletBalance], report: AuditReport
) -> dict[int, dict[tuple[str, str], int]]:
    """The replayed balances as of each wallet snapshot position, so a moving wallet compares exactly."""
    positions = sorted({b.as_of_position for b in listed.values() if b.as_of_position > 0})
    if positions and positions[-1] > report.replay_trial.last_wallet_position:
        report.notes.append(
            f"the wallet's snapshot (position {positions[-1]}) is newer than the last journaled wallet event "
            f"(position {report.replay_trial.last_wallet_position}); if events arrived after the replay started, "
            "differences may be timing: rerun"
        )
    as_of: dict[int, dict[tuple[str, str], int]] = {}
    for position in positions:
        trial = await queries.trial_balance(replay_conn, as_of_position=position)
        as_of[position] = {(row.account, row.bucket): row.balance_minor for row in trial.rows}
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
    )
    wallet = None
    if not args.no_wallet:
        wallet = GrpcWalletBalances(args.wallet, operator_token(Role.AUDITOR, "audit"))
    report = await audit_replay(config, wallet, progress=None if args.no_progress else _Progress(err))
    print_report(report, out, wallet_skipped=args.no_wallet)
    if report.differences:
        return EXIT_DIFFERENCES
    return EXIT_ERROR if report.wallet_error else EXIT_OK


# --- verify-round ----------------------------------------------------------------------------------------


async def _run_verify_round(args: argparse.Namespace, out: TextIO) -> int:
    conn = await _connect(args.dsn, args.schema)
    async with conn:
        record = await queries.round_record(conn, args.round_id)
    evidence = RoundEvidence.of(record)
    step = None if args.no_recompute else recompute_via_table(args.table)
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


async def bench_replay(events: int, dsn: str, kafka: str) -> tuple[ReplayReport, int]:
    """Replay ``events`` synthetic events from scratch topics; returns the report and the entries journaled."""
    tag = uuid.uuid4().hex[:8]
    topics = Topics(f"bench{tag}.")
    specs = [TopicSpec(topics.wallet_events, partitions=6), TopicSpec(topics.table_events, partitions=6)]
    ensure_topics(kafka, specs)
    schema = f"ledger_bench_{tag}"
    try:
        _produce_synthetic(kafka, topics, events)
        report = await replay(dsn, kafka, [topics.wallet_events, topics.table_events], JOURNAL, schema)
        conn = await _connect(dsn, schema)
        async with conn:
            cur = await conn.execute("SELECT count(*) FROM journal_entries")
            row = await cur.fetchone()
        return report, int(row[0]) if row else 0
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        admin = make_admin(kafka, "niuniu-audit-bench")
        try:
            admin.delete_topics([s.name for s in specs])
        finally:
            admin.close()


def _produce_synthetic(kafka: str, topics: Topics, events: int) -> int:
    producer = make_producer(kafka, "niuniu-audit-bench", linger_ms=20, batch_size=256 * 1024)
    versions: dict[str, int] = {}
    now = datetime.now(UTC)
    sent = 0
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
            sent += 1
        producer.flush()
    finally:
        producer.close()
    return sent


def _run_bench(args: argparse.Namespace, out: TextIO) -> int:
    report, entries = _run_coroutine(bench_replay(args.events, args.dsn, args.kafka))
    rate = report.events_read / report.seconds if report.seconds else 0.0
    print(f"ledger replay benchmark, {report.events_read} events ({entries} journal entries)", file=out)
    print(f"  replay_seconds           {report.seconds:10.2f}", file=out)
    print(f"  replay_events_per_s      {rate:10.0f}", file=out)
    print(f"  entries_per_s            {entries / report.seconds if report.seconds else 0.0:10.0f}", file=out)
    return EXIT_OK


# --- command line ----------------------------------------------------------------------------------------


def _default_wallet_address() -> str:
    port = os.environ.get("NIUNIU_WALLET_GRPC_PORT", str(DEFAULT_WALLET_PORT))
    return os.environ.get("NIUNIU_WALLET_ADDR", f"127.0.0.1:{port}")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dsn",
        default=env.get("NIUNIU_LEDGER_DSN") or env.get("DATABASE_URL") or DEFAULT_DSN,
        help="the ledger's PostgreSQL (default: $NIUNIU_LEDGER_DSN, $DATABASE_URL)",
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
    rep = commands.add_parser("replay", parents=[common], help="rebuild the journal from Kafka and reconcile it")
    rep.add_argument(
        "--wallet", default=_default_wallet_address(), help="wallet gRPC address (default: $NIUNIU_WALLET_ADDR)"
    )
    rep.add_argument("--no-wallet", action="store_true", help="skip the comparison with the wallet's balances")
    rep.add_argument("--replay-schema", default="", help="schema to rebuild into (default: ledger_replay_<time>)")
    rep.add_argument("--keep", action="store_true", help="keep the replayed schema for inspection")
    rep.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    ver = commands.add_parser("verify-round", parents=[common], help="check a round's journal against its settlement")
    ver.add_argument("round_id", metavar="ROUND")
    ver.add_argument("--table", default=table_address(), help="table gRPC address (default: $NIUNIU_TABLE_ADDR)")
    ver.add_argument("--no-recompute", action="store_true", help="check the journal only; do not re-deal the round")
    bench = commands.add_parser("bench-replay", parents=[common], help="replay speed on synthetic events")
    bench.add_argument("--events", type=int, default=DEFAULT_BENCH_EVENTS, help="how many events (default: 20000)")
    return parser


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
            code = _run_coroutine(_run_verify_round(args, out))
        else:
            if args.events <= 0:
                print("niuniu-audit: error: --events must be positive", file=err)
                return EXIT_ERROR
            code = _run_bench(args, out)
    except (psycopg.Error, OSError) as error:
        print(f"niuniu-audit: error: {type(error).__name__}: {error}", file=err)
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
