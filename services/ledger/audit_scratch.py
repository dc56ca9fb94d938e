"""The scratch store a replay of the audit is rebuilt in (a database of its own, or a schema), and the
connections the audit opens on it and on the live journal."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from services.ledger.audit_config import AuditConfig

SCRATCH_DATABASE_PREFIX = "niuniu_audit_"


async def connect(dsn: str, schema: str) -> psycopg.AsyncConnection:
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
    return conn


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


async def drop_schema(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
