"""PostgreSQL access: one async pool per service, schema set-up, helpers."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool


async def open_pool(
    dsn: str, *, min_size: int = 2, max_size: int = 20, schema: str | None = None
) -> AsyncConnectionPool:
    """Open a pool whose connections use ``schema`` first on their search path (when given)."""

    async def configure(conn: psycopg.AsyncConnection) -> None:
        if schema is not None:
            await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
            await conn.commit()

    pool = AsyncConnectionPool(dsn, min_size=min_size, max_size=max_size, open=False, configure=configure)
    await pool.open(wait=True, timeout=30)
    return pool


async def run_ddl(conn: psycopg.AsyncConnection, statements: Sequence[str]) -> None:
    """Apply idempotent DDL (``CREATE ... IF NOT EXISTS``) in one transaction.

    An advisory lock makes concurrent starts of several replicas safe: two
    ``CREATE TABLE IF NOT EXISTS`` racing can otherwise fail on the catalog.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('niuniu.ddl'))")
        for statement in statements:
            await conn.execute(statement)


async def create_schema(conn: psycopg.AsyncConnection, schema: str, *, fresh: bool = False) -> None:
    async with conn.transaction():
        if fresh:
            await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
