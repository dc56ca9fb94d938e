"""The replay's scratch schema: made with the projection's tables (UNLOGGED, without their plain indexes,
foreign keys and implied unique constraints), and those built once at the end over the replayed tables."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from backbone.db import create_schema, run_ddl
from backbone.handlers import TRACKING_SCHEMA
from backbone.replay.model import Projection

# Connections building the deferred indexes and constraints at the end of a replay, a table each.
REPLAY_BUILD_CONNECTIONS = 2

_PLAIN_INDEX = re.compile(r"\s*CREATE\s+INDEX\s", re.IGNORECASE)
_INDEX_TABLE = re.compile(r"\sON\s+(?:ONLY\s+)?([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


async def scratch_schema(conn: psycopg.AsyncConnection, schema: str, projection: Projection) -> list[Deferred]:
    """The fresh ``schema`` with the projection's tables but its plain indexes (``_scratch_tables``), ``conn``
    writing there without waiting for WAL flushes; the constraints to put back at the end."""
    await create_schema(conn, schema, fresh=True)
    await use_scratch(conn, schema)
    await run_ddl(conn, [*TRACKING_SCHEMA, *(s for s in projection.ddl if not _PLAIN_INDEX.match(s))])
    return await _scratch_tables(conn, schema, projection.implied_unique)


async def use_scratch(conn: psycopg.AsyncConnection, schema: str) -> None:
    await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
    await conn.execute("SET synchronous_commit = off")  # a scratch schema: nothing to lose in a crash
    await conn.commit()


def plain_indexes(projection: Projection) -> list[str]:
    """The projection's plain (non-unique) indexes: built at the end of a replay, or not at all."""
    return [s for s in projection.ddl if _PLAIN_INDEX.match(s)]


async def build_indexes(dsn: str, schema: str, statements: Sequence[str]) -> None:
    """Build ``statements`` (plain indexes) on the replayed ``schema`` as a replay's end builds them."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
        await build_deferred(dsn, conn, schema, statements, [])


@dataclass(frozen=True, slots=True)
class Deferred:
    """A statement built once at the end of a replay: a plain index or a constraint put back."""

    table: str
    statement: str | sql.Composed
    foreign_key: bool = False


async def _scratch_tables(conn: psycopg.AsyncConnection, schema: str, implied_unique: Sequence[str]) -> list[Deferred]:
    """Make the scratch schema's tables UNLOGGED; take their foreign keys and ``implied_unique``
    constraints off until the end.

    Returns the statements that put them back: each is then checked once, over the whole replayed
    table, instead of on every row inserted.
    """
    async with conn.transaction():
        cur = await conn.execute(
            "SELECT r.relname, k.conname, pg_get_constraintdef(k.oid), k.contype = 'f' FROM pg_constraint k"
            " JOIN pg_class r ON r.oid = k.conrelid JOIN pg_namespace s ON s.oid = r.relnamespace"
            " WHERE s.nspname = %s AND (k.contype = 'f' OR k.conname = ANY(%s))"
            " ORDER BY k.contype = 'f', 1, 2",
            (schema, list(implied_unique)),
        )
        taken_off = [(str(r[0]), str(r[1]), str(r[2]), bool(r[3])) for r in await cur.fetchall()]
        missing = set(implied_unique) - {name for _, name, _, _ in taken_off}
        if missing:
            raise ValueError(f"implied_unique names no constraint of the projection: {sorted(missing)}")
        for table, name, _, _ in reversed(taken_off):  # foreign keys first: they may need a unique one
            await conn.execute(
                sql.SQL("ALTER TABLE {}.{} DROP CONSTRAINT {}").format(
                    sql.Identifier(schema), sql.Identifier(table), sql.Identifier(name)
                )
            )
        cur = await conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace"
            " WHERE s.nspname = %s AND c.relkind = 'r' ORDER BY 1",
            (schema,),
        )
        for (table,) in await cur.fetchall():
            await conn.execute(
                sql.SQL("ALTER TABLE {}.{} SET UNLOGGED").format(sql.Identifier(schema), sql.Identifier(str(table)))
            )
    return [
        Deferred(
            table,
            sql.SQL("ALTER TABLE {}.{} ADD CONSTRAINT {} {}").format(
                sql.Identifier(schema), sql.Identifier(table), sql.Identifier(name), sql.SQL(definition)
            ),
            foreign_key=foreign_key,
        )
        for table, name, definition, foreign_key in taken_off
    ]


async def build_deferred(
    dsn: str, conn: psycopg.AsyncConnection, schema: str, indexes: Sequence[str], put_back: Sequence[Deferred]
) -> None:
    """The plain indexes and the constraints taken off, built once over the replayed tables.

    Table by table, up to ``REPLAY_BUILD_CONNECTIONS`` tables side by side (the largest first), each
    on a connection of its own: the tables' plain indexes and unique constraints; then, on ``conn``,
    the foreign keys, which may need a unique constraint built in the first step. Nothing waits for
    another connection's lock: a plain index or a unique constraint locks only its own table.
    """
    by_table: dict[str, list[str | sql.Composed]] = {}
    for statement in indexes:
        found = _INDEX_TABLE.search(statement)
        if found is None:
            raise ValueError(f"no table named in the projection's index: {statement!r}")
        by_table.setdefault(found.group(1), []).append(statement)
    for deferred in put_back:
        if not deferred.foreign_key:
            by_table.setdefault(deferred.table, []).append(deferred.statement)
    cur = await conn.execute(
        "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace"
        " WHERE s.nspname = %s AND c.relkind = 'r'",
        (schema,),
    )
    sizes = {str(name): int(size) for name, size in await cur.fetchall()}
    await conn.commit()
    waiting = sorted(by_table.items(), key=lambda item: -sizes.get(item[0], 0))

    async def builder() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            await other.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
            await other.execute("SET statement_timeout = 0")  # each built once over the whole replay
            while waiting:
                _, statements = waiting.pop(0)
                for statement in statements:
                    await other.execute(statement)

    builders = [asyncio.ensure_future(builder()) for _ in range(min(REPLAY_BUILD_CONNECTIONS, len(waiting)))]
    try:
        await asyncio.gather(*builders)
    except BaseException:  # the first failure is the replay's; the other builders stop
        for task in builders:
            task.cancel()
        await asyncio.gather(*builders, return_exceptions=True)
        raise
    async with conn.transaction():
        await conn.execute("SET LOCAL statement_timeout = 0")
        for deferred in put_back:
            if deferred.foreign_key:
                await conn.execute(deferred.statement)


async def table_digest(
    conn: psycopg.AsyncConnection, schema: str, table: str, order_by: str
) -> list[tuple[object, ...]]:
    """Every row of ``schema.table`` in a stable order, for comparing a replay with the live projection."""
    query = sql.SQL("SELECT * FROM {}.{} ORDER BY {}").format(
        sql.Identifier(schema), sql.Identifier(table), sql.SQL(order_by)
    )
    cur = await conn.execute(query)
    return list(await cur.fetchall())
