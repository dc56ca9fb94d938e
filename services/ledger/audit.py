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
import os
import sys
import time
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TextIO, TypeAlias, TypeVar

import psycopg

from backbone.config import DEFAULT_KAFKA
from backbone.cpuquota import MIN_SHARE, unavailable_reason
from backbone.kafka import use_identity
from backbone.replay.model import ReplayGap
from backbone.replay.workers import MAX_REPLAY_WORKERS
from backbone.topics import Topics
from services.ledger import queries
from services.ledger.archived import ArchiveBroken, print_archive
from services.ledger.audit_bench import bench_replay, print_bench
from services.ledger.audit_config import DEFAULT_CUT_TIMEOUT_S, AuditConfig, AuditError
from services.ledger.audit_login import auditor_token
from services.ledger.audit_replay import audit_replay, print_report
from services.ledger.audit_scratch import connect
from services.ledger.recompute import recompute_via_table, table_address
from services.ledger.reconcile import GrpcWalletBalances
from services.ledger.verify import RoundEvidence, journal_text, settlement_text, verify

EXIT_OK = 0
EXIT_DIFFERENCES = 1
EXIT_ERROR = 2

DEFAULT_DSN = "postgresql://niuniu@127.0.0.1:54329/niuniu_ledger"
DEFAULT_WALLET_PORT = 50053
DEFAULT_BENCH_EVENTS = 20_000
PROGRESS_STEP_PERCENT = 5

# The command line's subcommands (argparse names no public type for them).
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


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


# --- verify-round ----------------------------------------------------------------------------------------


async def _run_verify_round(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    conn = await connect(args.dsn, args.schema)
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


def _run_bench(args: argparse.Namespace, out: TextIO) -> int:
    bench = _run_coroutine(
        bench_replay(args.events, args.scratch_dsn or args.dsn, args.kafka, args.workers, args.cpu_per_worker)
    )
    print_bench(bench, args.cpu_per_worker, out)
    return EXIT_OK


# --- command line ----------------------------------------------------------------------------------------


def _default_wallet_address() -> str:
    port = os.environ.get("NIUNIU_WALLET_GRPC_PORT", str(DEFAULT_WALLET_PORT))
    return os.environ.get("NIUNIU_WALLET_ADDR", f"127.0.0.1:{port}")


def build_parser() -> argparse.ArgumentParser:
    """``niuniu-audit``'s command line: its three commands, each with the connections' flags."""
    common, credentials = _connection_flags(os.environ), _credential_flags(os.environ)
    parser = argparse.ArgumentParser(
        prog="niuniu-audit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    _add_replay(commands, [common, credentials], os.environ)
    _add_verify_round(commands, [common, credentials])
    _add_bench_replay(commands, [common], os.environ)
    return parser


def _connection_flags(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The flags of every command: the live journal's database and schema, Kafka and its topics."""
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
    return common


def _credential_flags(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The flags of the commands that read the wallet or the table as an auditor."""
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
    return credentials


def _add_replay(commands: Commands, parents: list[argparse.ArgumentParser], env: Mapping[str, str]) -> None:
    rep = commands.add_parser("replay", parents=parents, help="rebuild the journal from Kafka and reconcile it")
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


def _add_verify_round(commands: Commands, parents: list[argparse.ArgumentParser]) -> None:
    ver = commands.add_parser("verify-round", parents=parents, help="check a round's journal against its settlement")
    ver.add_argument("round_id", metavar="ROUND")
    ver.add_argument("--table", default=table_address(), help="table gRPC address (default: $NIUNIU_TABLE_ADDR)")
    ver.add_argument("--no-recompute", action="store_true", help="check the journal only; do not re-deal the round")


def _add_bench_replay(commands: Commands, parents: list[argparse.ArgumentParser], env: Mapping[str, str]) -> None:
    bench = commands.add_parser("bench-replay", parents=parents, help="replay speed on synthetic events")
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
