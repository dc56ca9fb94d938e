"""Fixtures shared by the table service's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from backbone.db import open_pool


@pytest.fixture
async def pool(dsn: str, schema: str) -> AsyncIterator[AsyncConnectionPool]:
    """A pool on the test's own schema (six connections: a round's steps and its watchers side by side)."""
    pool = await open_pool(dsn, schema=schema, max_size=6)
    yield pool
    await pool.close()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """A Redis client (tests touch only keys and channels under their own prefix)."""
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()
