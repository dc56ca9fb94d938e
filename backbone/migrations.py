"""Versioned schema migrations (yoyo-migrations): applying a database's, and checking its version.

Each service's database has a folder of migrations (``services/<service>/migrations``, SQL files
named ``NNNN.<what>.sql``) and a version table, yoyo's ``_yoyo_migration``, in the schema the
service uses. The event store in it (its tables, sequence, indexes and append functions) is the
backbone's: its migrations are backbone's own (``eventstore_migrations``, ids ``eventstore-*``),
applied to every service database before the service's (``store_migrations``), and no service's
migration names its tables. ``niuniu-migrate`` (``tools/migrate.py``) applies them once per release, each
migration in one transaction, with a short ``lock_timeout``: a statement that waits for a lock
held by the running services' transactions fails soon instead of queueing every bet behind its
ACCESS EXCLUSIVE lock, and the run is tried again a bounded number of times. A service runs no
DDL: at start it only checks that every migration it knows has been applied
(``check_version``) and refuses to serve otherwise. docs/decisions/0012-versioned-migrations.md
says how a column changes in steps (expand/contract).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from yoyo import read_migrations
from yoyo.backends.base import DatabaseBackend, get_backend_class
from yoyo.connections import DatabaseURI
from yoyo.exceptions import LockTimeout

from backbone.config import ConfigError

log = logging.getLogger(__name__)

VERSION_TABLE = "_yoyo_migration"
"""yoyo's table of applied migrations (id, hash, time), one per database schema."""
LOCK_TIMEOUT_MS = 5_000
"""How long one migration statement waits for a table lock before it fails (and the run is tried again)."""
ATTEMPTS = 6
RETRY_S = 2.0
"""A run that lost a lock wait is tried again after 2, 4, 6 ... s: 30 s of waiting at most in all."""
YOYO_LOCK_S = 60
"""How long a run waits for another run of the same database (yoyo's lock row) before it fails."""


EVENT_STORE = Path(__file__).with_name("eventstore_migrations") / "core"
"""The event store's migrations, for every service database."""
FAMILY_READS = Path(__file__).with_name("eventstore_migrations") / "family_reads"
"""The index ``eventreads.read_family`` reads by, for a database whose service reads streams by family."""


class SchemaBehind(ConfigError):
    """The database lacks migrations this code needs: the service refuses to start."""


def store_migrations(own: Path, *, family_reads: bool = False) -> tuple[Path, ...]:
    """The migration folders of a service database whose own migrations are in ``own``, in the order they
    apply: the event store's first (the service's migrations never touch its tables), then ``own``."""
    return (EVENT_STORE, *((FAMILY_READS,) if family_reads else ()), own)


def migration_ids(folders: Sequence[Path]) -> list[str]:
    """The ids (file names without ``.sql``) of the migrations in ``folders``, in the order they apply."""
    return [
        p.name.removesuffix(".sql")
        for folder in folders
        for p in sorted(folder.glob("*.sql"))
        if not p.name.endswith(".rollback.sql")
    ]


def _backend(dsn: str, schema: str | None, lock_timeout_ms: int) -> DatabaseBackend:
    """A yoyo backend (psycopg 3) on ``dsn``, its search path ``schema`` when given."""
    params: dict[str, Any] = {k: v for k, v in conninfo_to_dict(dsn).items() if v is not None}
    options = f"{params.pop('options', '')} -c lock_timeout={lock_timeout_ms}".strip()
    args: dict[str, Any] = {**params, "options": options}
    if schema is not None:
        args["schema"] = sql.Identifier(schema).as_string()
    uri = DatabaseURI(
        "postgresql+psycopg",
        args.pop("user", None),
        args.pop("password", None),
        args.pop("host", None),
        int(args.pop("port")) if "port" in args else None,
        args.pop("dbname", None),
        args,
    )
    backend: DatabaseBackend = get_backend_class(uri.scheme)(uri, VERSION_TABLE)
    backend.init_database()
    return backend


def _create_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))


def apply(
    dsn: str,
    folders: Sequence[Path],
    schema: str | None = None,
    *,
    lock_timeout_ms: int = LOCK_TIMEOUT_MS,
    attempts: int = ATTEMPTS,
) -> list[str]:
    """Apply the migrations of ``folders`` not yet applied to ``dsn`` (in ``schema``); their ids.

    They run in the order of ``folders``, each folder's in the order of their ids, unless a
    ``-- depends:`` (which may name a migration of an earlier folder) says otherwise. A run that
    failed on a lock wait (``lock_timeout``, a deadlock, or another run holding the database) is
    tried again; the migration that failed was rolled back whole.
    """
    if schema is not None:
        _create_schema(dsn, schema)
    for attempt in range(1, attempts + 1):
        try:
            return _apply_once(dsn, folders, schema, lock_timeout_ms)
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected, LockTimeout) as error:
            if attempt == attempts:
                raise
            log.warning("migration waited too long for a lock; again", extra={"error": repr(error)})
            time.sleep(RETRY_S * attempt)
    raise AssertionError("unreachable")


def _apply_once(dsn: str, folders: Sequence[Path], schema: str | None, lock_timeout_ms: int) -> list[str]:
    backend = _backend(dsn, schema, lock_timeout_ms)
    try:
        with backend.lock(YOYO_LOCK_S):
            pending = backend.to_apply(read_migrations(*(str(f) for f in folders)))
            backend.apply_migrations(pending)
            return [str(m.id) for m in pending]
    finally:
        backend.connection.close()


async def applied_ids(conn: psycopg.AsyncConnection[Any], schema: str | None = None) -> set[str]:
    """The migrations applied to ``schema`` (default: the current one of ``conn``); none without a version table."""
    cur = await conn.execute(
        "SELECT to_regclass(format('%%I.%%I', coalesce(%s, current_schema()), %s::text))", (schema, VERSION_TABLE)
    )
    row = await cur.fetchone()
    if row is None or row[0] is None:
        return set()
    cur = await conn.execute(sql.SQL("SELECT migration_id FROM {}").format(sql.SQL(str(row[0]))))
    return {str(r[0]) for r in await cur.fetchall()}


async def check_version(
    conn: psycopg.AsyncConnection[Any], folders: Sequence[Path], database: str, schema: str | None = None
) -> None:
    """Raise ``SchemaBehind`` unless every migration of ``folders`` was applied to ``schema`` (default:
    ``conn``'s current one).

    Migrations the code does not know (a newer release's, after a rollback) are allowed: expand/contract
    keeps each schema usable by the release before it.
    """
    applied = await applied_ids(conn, schema)
    missing = [m for m in migration_ids(folders) if m not in applied]
    if missing:
        if schema is None:
            cur = await conn.execute("SELECT current_schema()")
            row = await cur.fetchone()
            schema = str(row[0]) if row else "?"
        raise SchemaBehind(
            f"the {database} database (schema {schema}) is older than this release: migrations"
            f" {', '.join(missing)} not applied. Run `niuniu-migrate {database}` (in Kubernetes the"
            " release's niuniu-migrate Job) and start the service again"
        )
