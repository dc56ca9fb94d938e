"""Start a service in this process for integration tests (its tables in a schema, its topics under a prefix)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import psycopg
from psycopg import sql

from backbone.auth import Tokens
from backbone.config import Settings
from backbone.grpcserver import RunningServer
from backbone.migrations import apply
from backbone.service import ServiceContext, ServiceSpec, start
from backbone.topics import Topics


async def migrate(spec: ServiceSpec, dsn: str, schema: str) -> None:
    """Bring ``schema`` to ``spec``'s migrations (niuniu-migrate's work), as a release does before a start."""
    if spec.migrations is not None:
        await asyncio.to_thread(apply, dsn, spec.migrations, schema)


@contextlib.asynccontextmanager
async def running_service(
    spec: ServiceSpec, infra: dict[str, str], *, prefix: str, schema: str
) -> AsyncIterator[tuple[RunningServer, ServiceContext]]:
    """Start ``spec`` in this process on a free port, its tables in ``schema``, its topics under ``prefix``."""
    settings = Settings(
        service=spec.name,
        dsn=infra["DATABASE_URL"],
        kafka_bootstrap_servers=infra["KAFKA_BOOTSTRAP_SERVERS"],
        redis_url=infra["REDIS_URL"],
        grpc_port=0,
        metrics_port=0,
    )
    await migrate(spec, settings.dsn, schema)
    running, ctx = await start(spec, settings, Topics(prefix), schema=schema, tokens=Tokens.development())
    try:
        yield running, ctx
    finally:
        await running.stop(0.5)
        await ctx.redis.aclose()
        await ctx.pool.close()
        async with await psycopg.AsyncConnection.connect(infra["DATABASE_URL"], autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


SUITE_SCHEMAS = r"^(e2e_.+|t_[0-9a-f]{12})$"
"""The schemas the suite's systems make in the test database: ``e2e_<run>_<service>`` (tests/e2e/stack.py)
and ``t_<id>`` (the ``schema`` fixture, which drops its own unless its session was killed)."""


def drop_schemas(dsn: str, pattern: str) -> list[str]:
    """Drop every schema whose name matches ``pattern`` (a PostgreSQL regular expression), each in its own
    transaction; returns their names."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname ~ %s ORDER BY nspname", (pattern,))
        names = [str(row[0]) for row in cur.fetchall()]
        for name in names:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    return names
