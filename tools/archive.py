"""``python -m tools.archive``: write, verify and prune with the sealed archive (backbone/archive.py).

  python -m tools.archive write  --archive DIR [--store NAME=DSN ...] [--kafka HOST:PORT] [--topic-prefix P]
      Seal the topics' records since the last segment into the next one; prints its number, records,
      size and SHA-256 (the new head: keep it apart from the archive, e.g. in the operator's log).
  python -m tools.archive verify --archive DIR [--head SHA256]
      Recompute every segment's hash and check the chain and the offsets; exit 1 on a problem.
  python -m tools.archive prune  --archive DIR [--store NAME=DSN ...] [--older-than SECONDS]
      Verify, then take out of each store what the archive holds (backbone/prune.py), VACUUM, and
      print the hot tier (rows, their bytes, disk) of each store before and after.

A store is a service's database: ``NAME=DSN`` (a DSN may set ``options=-csearch_path=SCHEMA``); the
default is every service whose NIUNIU_<SERVICE>_DSN is set (rng, table, wallet, ledger). Exit status:
0 done, 1 the archive does not verify, 2 bad usage or a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

import psycopg

from backbone.archive import ArchiveError, archive_next, verify
from backbone.config import DEFAULT_KAFKA
from backbone.prune import TableSize, hot_tier, prune_processed, prune_store, vacuum
from backbone.topics import Topics

SERVICES = ("rng", "table", "wallet", "ledger")
DEFAULT_OLDER_THAN_S = 7 * 24 * 3600.0


def _stores(items: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    if not items:
        return {s: env[f"NIUNIU_{s.upper()}_DSN"] for s in SERVICES if env.get(f"NIUNIU_{s.upper()}_DSN")}
    stores = {}
    for item in items:
        name, sep, dsn = item.partition("=")
        if not sep or not dsn:
            raise SystemExit(f"--store {item!r}: not NAME=DSN")
        stores[name] = dsn
    return stores


def _topics(prefix: str) -> list[str]:
    return [s.name for s in Topics(prefix).specs()]


async def _write(args: argparse.Namespace, out: TextIO) -> int:
    stores = _stores(args.store, os.environ)
    entry, _ = await archive_next(Path(args.archive), args.kafka, _topics(args.topic_prefix), stores)
    if entry is None:
        print("archive: nothing new to seal", file=out)
        return 0
    print(
        f"archive: segment {entry.number} sealed: {entry.file}, {entry.records} records, {entry.bytes} bytes", file=out
    )
    print(f"head: {entry.sha256}", file=out)
    return 0


def _verify(args: argparse.Namespace, out: TextIO) -> int:
    checked = verify(Path(args.archive), args.head)
    for problem in checked.problems:
        print(f"[archive] {problem}", file=out)
    records = sum(h.records for h in checked.headers)
    print(f"archive: {len(checked.headers)} segments, {records} records, {checked.size_bytes} bytes", file=out)
    print(f"head: {checked.head}", file=out)
    print("RESULT: OK" if checked.ok else "RESULT: FAILED", file=out)
    return 0 if checked.ok else 1


def _print_tier(label: str, tier: Mapping[str, TableSize], out: TextIO) -> None:
    for table, size in tier.items():
        print(
            f"  {label:<22} {table:<17} rows {size.rows:>9}  data {size.data_bytes:>11} B"
            f"  disk {size.disk_bytes:>11} B",
            file=out,
        )
    total = sum(s.data_bytes for s in tier.values())
    print(f"  {label:<22} {'total':<17} data {total} B, disk {sum(s.disk_bytes for s in tier.values())} B", file=out)


async def _prune(args: argparse.Namespace, out: TextIO) -> int:
    checked = verify(Path(args.archive))
    if not checked.ok:
        for problem in checked.problems:
            print(f"[archive] {problem}", file=out)
        print("RESULT: FAILED (nothing pruned)", file=out)
        return 1
    print(f"prune: archive of {len(checked.headers)} segments, head {checked.head}", file=out)
    for name, dsn in _stores(args.store, os.environ).items():
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            before = await hot_tier(conn)
            store = await prune_store(conn, name, checked.headers, args.older_than)
            processed = await prune_processed(conn, checked.headers)
            await vacuum(conn)
            after = await hot_tier(conn)
        print(
            f"{name}: pruned {store.outbox} outbox rows, {store.events} events, {processed.processed} tracking rows",
            file=out,
        )
        for note in [*store.notes, *processed.notes]:
            print(f"  note: {note}", file=out)
        _print_tier(f"{name} hot tier before", before, out)
        _print_tier(f"{name} hot tier after", after, out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.archive", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--archive", default=os.environ.get("NIUNIU_ARCHIVE_DIR", ""), required=False)
    stores = argparse.ArgumentParser(add_help=False)
    stores.add_argument("--store", action="append", default=[], help="NAME=DSN of a service's database")
    write = commands.add_parser("write", parents=[common, stores], help="seal the next segment")
    write.add_argument("--kafka", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", DEFAULT_KAFKA))
    write.add_argument("--topic-prefix", default=os.environ.get("NIUNIU_TOPIC_PREFIX", ""))
    check = commands.add_parser("verify", parents=[common], help="check hashes, chain and offsets")
    check.add_argument("--head", default="", help="the SHA-256 the newest segment must have")
    prune = commands.add_parser("prune", parents=[common, stores], help="prune the stores of what is archived")
    prune.add_argument(
        "--older-than",
        type=float,
        default=DEFAULT_OLDER_THAN_S,
        help="keep events younger than this many seconds (default: 7 days)",
    )
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    if not args.archive:
        print("error: --archive DIR (or NIUNIU_ARCHIVE_DIR) is required", file=sys.stderr)
        return 2
    try:
        if args.command == "write":
            return asyncio.run(_write(args, out))
        if args.command == "verify":
            return _verify(args, out)
        return asyncio.run(_prune(args, out))
    except (ArchiveError, psycopg.Error, OSError) as error:
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
