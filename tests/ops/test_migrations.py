"""Versioned migrations: a database the services' old start-up DDL made, or the migrations before the event
store's schema became backbone's, is upgraded with its rows; the migrated schema is the one the code
describes; the services' migrations leave the event store's tables to backbone; and a service refuses a
schema older than it needs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from backbone.auth import development_env
from backbone.eventreads import FAMILY_SCHEMA
from backbone.eventstore import SCHEMA as STORE_SCHEMA
from backbone.handlers import TRACKING_SCHEMA
from backbone.healthcheck import wait
from backbone.lease import FENCE_SCHEMA
from backbone.localports import free_port
from backbone.migrations import EVENT_STORE, VERSION_TABLE, apply, migration_ids
from backbone.restorecheck import SCHEMA as CHECKPOINT_SCHEMA
from services.ledger.projection import DDL as LEDGER_DDL
from services.rng.store import DDL as RNG_DDL
from services.table.schema import DDL as TABLE_DDL
from services.wallet.repo import SCHEMA as WALLET_SCHEMA
from tools.migrate import DATABASES, FOLDERS, migrate

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
BEFORE = Path(__file__).parent / "fixtures" / "schema_before_migrations"
"""Each database's DDL as the services ran it at every start before versioned migrations."""
RELEASED = Path(__file__).parent / "fixtures" / "migrations_before_eventstore"
"""Each database's migrations as released before the event store's schema moved to backbone: the event
store in each 0001.baseline and the outbox's trace context in each 0002."""

COMMON_ROWS = (
    "INSERT INTO events VALUES (7, 'b9f1b2d4-8f5e-4a53-9a4b-0c7f6a1d2e3f', 's-1', 1, 'Made', 'c-1', now(), '\\x01')",
    "INSERT INTO outbox (position, topic, record_key, key_hash) VALUES (7, 'niuniu.x.events', 's-1', 3)",
    "INSERT INTO consumer_positions VALUES ('settlement', 'niuniu.table.events', 2, 41)",
    "INSERT INTO lease_fences VALUES ('relay:0', 5)",
)
OWN_ROWS = {
    "rng": "INSERT INTO rng_rounds (round_id, purpose, server_seed, commitment, client_seeds)"
    " VALUES ('r-1', 'deck', '\\x02', 'c0ffee', '{a,b}')",
    "table": "INSERT INTO tables (table_id, variant, config, limits, config_version, closing_at)"
    " VALUES ('t-1', 'classic', '{}', '\\x03', 1, now())",
    "wallet": "INSERT INTO wallet_accounts (account, kind, available_minor) VALUES ('player:p-1', 'player', 500)",
    "ledger": "INSERT INTO balances VALUES ('house', 'available', 1, 0, 500, 500, 1)",
}
CODE_DDL = {
    "rng": RNG_DDL,
    "table": (*FAMILY_SCHEMA, *TABLE_DDL),
    "wallet": WALLET_SCHEMA,
    "ledger": LEDGER_DDL,
}
"""The DDL the code keeps for scratch schemas (tests, replays): it must describe the migrated schema."""


@pytest.fixture
def schemas(dsn: str, unique: str) -> Iterator[list[str]]:
    """Names of schemas a test makes; all dropped after it."""
    made: list[str] = []
    yield made
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in made:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def _in_schema(dsn: str, schema: str, statements: list[str] | tuple[str, ...]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        with conn.transaction():
            for statement in statements:
                conn.execute(statement)


def _columns(dsn: str, schema: str) -> dict[str, list[str]]:
    """Each table of ``schema`` but yoyo's own -> its columns, in order."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name !~ 'yoyo' ORDER BY table_name, ordinal_position",
            (schema,),
        ).fetchall()
    tables: dict[str, list[str]] = {}
    for table, column in found:
        tables.setdefault(str(table), []).append(str(column))
    return tables


def _rows(dsn: str, schema: str, tables: dict[str, list[str]]) -> dict[str, list[tuple[object, ...]]]:
    """Every row of these tables of ``schema``, these columns only, as text (a later migration may add some)."""
    with psycopg.connect(dsn) as conn:
        return {
            name: conn.execute(
                sql.SQL("SELECT ({})::text FROM {} ORDER BY 1").format(
                    sql.SQL(", ").join(sql.Identifier(c) for c in columns), sql.Identifier(schema, name)
                )
                if len(columns) > 1
                else sql.SQL("SELECT {}::text FROM {} ORDER BY 1").format(
                    sql.Identifier(columns[0]), sql.Identifier(schema, name)
                )
            ).fetchall()
            for name, columns in tables.items()
        }


def _shape(dsn: str, schema: str) -> dict[str, object]:
    """Columns (in order, with types, defaults and nullability), constraints, indexes and functions of ``schema``."""
    with psycopg.connect(dsn) as conn:
        columns = conn.execute(
            "SELECT table_name, ordinal_position, column_name, data_type, replace(column_default, %s, ''), is_nullable"
            " FROM information_schema.columns WHERE table_schema = %s AND table_name !~ 'yoyo' ORDER BY 1, 2",
            (f"{schema}.", schema),
        ).fetchall()
        constraints = conn.execute(
            "SELECT t.relname, conname, replace(pg_get_constraintdef(c.oid), %s, '') FROM pg_constraint c"
            " JOIN pg_class t ON t.oid = c.conrelid JOIN pg_namespace n ON n.oid = c.connamespace"
            " WHERE n.nspname = %s AND t.relname !~ 'yoyo' ORDER BY 1, 2",
            (f"{schema}.", schema),
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexname, replace(indexdef, %s, '') FROM pg_indexes"
            " WHERE schemaname = %s AND tablename !~ 'yoyo' ORDER BY 1",
            (f"{schema}.", schema),
        ).fetchall()
        functions = conn.execute(
            "SELECT proname, md5(btrim(regexp_replace(prosrc, '\\s+', ' ', 'g')))"  # indentation aside
            " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = %s ORDER BY 1",
            (schema,),
        ).fetchall()
    return {"columns": columns, "constraints": constraints, "indexes": indexes, "functions": functions}


@pytest.mark.parametrize("database", DATABASES)
def test_a_database_made_by_the_old_start_up_ddl_is_upgraded_with_its_rows(
    database: str, dsn: str, unique: str, schemas: list[str]
) -> None:
    schema = f"mig_{database}_{unique}"
    schemas.append(schema)
    _in_schema(dsn, schema, [(BEFORE / f"{database}.sql").read_text(), *COMMON_ROWS, OWN_ROWS[database]])
    tables = _columns(dsn, schema)
    before = _rows(dsn, schema, tables)
    assert sum(len(rows) for rows in before.values()) >= len(COMMON_ROWS) + 1

    assert migrate(database, dsn, schema) == migration_ids(FOLDERS[database])
    assert migrate(database, dsn, schema) == []  # once only

    assert _rows(dsn, schema, tables) == before
    with psycopg.connect(dsn) as conn:
        applied = conn.execute(sql.SQL("SELECT migration_id FROM {}").format(sql.Identifier(schema, VERSION_TABLE)))
        assert sorted(str(r[0]) for r in applied.fetchall()) == sorted(migration_ids(FOLDERS[database]))


@pytest.mark.parametrize("database", DATABASES)
def test_the_migrated_schema_is_the_one_the_code_describes(
    database: str, dsn: str, unique: str, schemas: list[str]
) -> None:
    """A migration and the code's DDL change together: a schema made from either has the same shape."""
    migrated, described = f"mig_m_{database}_{unique}", f"mig_d_{database}_{unique}"
    schemas += [migrated, described]
    migrate(database, dsn, migrated)
    _in_schema(
        dsn, described, [*STORE_SCHEMA, *TRACKING_SCHEMA, *FENCE_SCHEMA, *CHECKPOINT_SCHEMA, *CODE_DDL[database]]
    )
    assert _shape(dsn, described) == _shape(dsn, migrated)


@pytest.mark.parametrize("database", DATABASES)
def test_a_database_migrated_before_the_event_store_was_backbones_upgrades_to_the_same_shape(
    database: str, dsn: str, unique: str, schemas: list[str]
) -> None:
    """Its 0001 and 0002 stay applied (a migration's id is its file's name); the event store's own migrations
    find what they make already there: no row changes, and the shape is the one a new database gets."""
    upgraded, fresh = f"mig_u_{database}_{unique}", f"mig_f_{database}_{unique}"
    schemas += [upgraded, fresh]
    released = apply(dsn, [RELEASED / database], upgraded)
    assert released == ["0001.baseline", "0002.trace-context-and-topic-checkpoints"]
    _in_schema(dsn, upgraded, [*COMMON_ROWS, OWN_ROWS[database]])
    tables = _columns(dsn, upgraded)
    before, shape = _rows(dsn, upgraded, tables), _shape(dsn, upgraded)

    assert migrate(database, dsn, upgraded) == [m for m in migration_ids(FOLDERS[database]) if m not in released]
    assert _rows(dsn, upgraded, tables) == before
    assert _shape(dsn, upgraded) == shape
    assert migrate(database, dsn, fresh)[0] == "eventstore-0001.baseline"  # the event store first
    assert _shape(dsn, fresh) == shape


def test_the_services_migrations_leave_the_event_store_to_backbone() -> None:
    """Only backbone names the event store's tables, sequence and functions; every database gets its migrations."""
    store_sql = r'(FROM|JOIN|INTO|ON|TABLE|UPDATE)[[:space:]]+("[^"]*"\.)?"?(events|outbox)([^a-z_]|$)'
    found = subprocess.run(
        ["git", "grep", "-nE", f"{store_sql}|niuniu_append_|events_position_seq", "--", "services"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert found.returncode == 1, found.stdout  # git grep: 1 = nothing found
    assert {database: folders[0] for database, folders in FOLDERS.items()} == dict.fromkeys(DATABASES, EVENT_STORE)


def test_no_start_up_ddl_adds_columns_outside_the_migrations() -> None:
    phrase = " ".join(("ADD", "COLUMN", "IF", "NOT", "EXISTS"))  # spelled apart: this file is searched too
    found = subprocess.run(
        [
            "git",
            "grep",
            "-n",
            phrase,
            "--",
            ".",
            ":!services/*/migrations/*",
            ":!backbone/eventstore_migrations/*",
            ":!tests/ops/fixtures/*",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert found.returncode == 1, found.stdout  # git grep: 1 = nothing found


def test_a_service_refuses_an_older_schema_and_names_the_command(
    infra: dict[str, str], dsn: str, unique: str, schemas: list[str]
) -> None:
    schema = f"mig_old_{unique}"
    schemas.append(schema)
    _in_schema(dsn, schema, [(BEFORE / "rng.sql").read_text()])  # the tables, but no migration recorded
    env = development_env(os.environ) | infra
    env |= {
        "NIUNIU_DB_SCHEMA": schema,
        "NIUNIU_TOPIC_PREFIX": f"t{unique}.",
        "NIUNIU_RNG_DSN": dsn,
        "NIUNIU_RNG_GRPC_PORT": str(free_port()),
        "NIUNIU_RNG_METRICS_PORT": str(free_port()),
    }
    done = subprocess.run([str(BIN / "niuniu-rng")], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "refusing to start" in done.stderr and "older than this release" in done.stderr
    assert "0001.baseline" in done.stderr and "not applied" in done.stderr and "niuniu-migrate rng" in done.stderr
    with psycopg.connect(dsn) as conn:  # it made nothing: no version table, no schema change
        assert conn.execute("SELECT to_regclass(%s)", (f"{schema}.{VERSION_TABLE}",)).fetchone() == (None,)

    migrate("rng", dsn, schema)
    env["NIUNIU_RNG_GRPC_PORT"] = str(free_port())
    proc = subprocess.Popen([str(BIN / "niuniu-rng")], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        assert wait({"rng": f"127.0.0.1:{env['NIUNIU_RNG_GRPC_PORT']}"}, 60) == {"rng": "SERVING"}
    finally:
        proc.terminate()
        proc.wait(timeout=20)
