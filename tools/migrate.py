"""niuniu-migrate: bring the services' databases to this release's schema (versioned migrations).

    niuniu-migrate                 # all four databases: rng, table, wallet, ledger
    niuniu-migrate table wallet    # some of them
    niuniu-migrate --list          # each database's applied and pending migrations, nothing changed

Each database is the one its service uses (NIUNIU_<SERVICE>_DSN, else DATABASE_URL), in the schema
NIUNIU_DB_SCHEMA or --schema names (default: the connection's own, public). Each database gets the
event store's migrations (backbone's own, ids eventstore-*) before its service's. Run it once per release
before the new services start (deploy/k8s runs it as the niuniu-migrate Job; scripts/up runs it
locally): the services run no DDL and refuse to start against an older schema. A statement waits at
most a few seconds for a lock and the run is tried again (backbone/migrations.py). Exit status 0
when every database is current, 1 on a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import psycopg
from yoyo.exceptions import LockTimeout

from backbone import migrations
from backbone.config import service_dsn
from services.ledger import server as ledger
from services.rng import server as rng
from services.table import server as table
from services.wallet import server as wallet

FOLDERS: dict[str, tuple[Path, ...]] = {
    "rng": rng.MIGRATIONS,
    "table": table.MIGRATIONS,
    "wallet": wallet.MIGRATIONS,
    "ledger": ledger.MIGRATIONS,
}
"""Each database's migration folders, in the order they apply (the ones its service checks at start)."""
DATABASES = tuple(FOLDERS)


def migrate(database: str, dsn: str, schema: str | None = None) -> list[str]:
    """Apply ``database``'s pending migrations to ``dsn`` (in ``schema``); the ids applied."""
    return migrations.apply(dsn, FOLDERS[database], schema)


async def _pending(database: str, dsn: str, schema: str | None) -> tuple[set[str], list[str]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        applied = await migrations.applied_ids(conn, schema)
    return applied, [m for m in migrations.migration_ids(FOLDERS[database]) if m not in applied]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="niuniu-migrate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("databases", nargs="*", metavar="DATABASE", help=f"of {', '.join(DATABASES)} (default: all)")
    parser.add_argument("--schema", default=os.environ.get("NIUNIU_DB_SCHEMA") or None, help="the services' schema")
    parser.add_argument("--list", action="store_true", help="show applied and pending migrations only")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.databases) - set(DATABASES))
    if unknown:
        parser.error(f"unknown databases {unknown}; known: {', '.join(DATABASES)}")
    status = 0
    for database in args.databases or DATABASES:
        dsn = service_dsn(database, os.environ)
        try:
            if args.list:
                applied, pending = asyncio.run(_pending(database, dsn, args.schema))
                print(f"{database}: applied {sorted(applied) or 'none'}; pending {pending or 'none'}")
            else:
                done = migrate(database, dsn, args.schema)
                print(f"{database}: applied {', '.join(done)}" if done else f"{database}: up to date")
        except (psycopg.Error, OSError, LockTimeout) as error:
            print(f"niuniu-migrate: {database}: {type(error).__name__}: {error}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
