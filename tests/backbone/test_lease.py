"""Contract of the Redis lease with fencing tokens (real Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from backbone.lease import RedisLease

pytestmark = pytest.mark.integration


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_only_one_owner_at_a_time_and_tokens_grow(redis: Redis, unique: str) -> None:
    a = RedisLease(redis, f"relay-{unique}", "a", ttl_ms=300)
    b = RedisLease(redis, f"relay-{unique}", "b", ttl_ms=300)
    first = await a.acquire()
    assert first is not None
    assert await b.acquire() is None
    assert await a.acquire() == first  # re-acquiring your own lease keeps the token
    assert await b.renew() is False
    assert await b.release() is False
    assert await a.holder() == ("a", first)

    await asyncio.sleep(0.45)  # a stops renewing: the lease expires
    second = await b.acquire()
    assert second is not None and second > first
    assert await a.renew() is False  # the stale owner learns it lost the lease
    assert await a.release() is False  # and cannot release the new owner's lease
    assert await b.holder() == ("b", second)


async def test_renew_keeps_the_lease_and_release_frees_it(redis: Redis, unique: str) -> None:
    a = RedisLease(redis, f"t-{unique}", "a", ttl_ms=200)
    b = RedisLease(redis, f"t-{unique}", "b", ttl_ms=200)
    token = await a.acquire()
    for _ in range(4):
        await asyncio.sleep(0.1)
        assert await a.renew()
    assert await b.acquire() is None
    assert await a.release()
    assert await a.holder() is None
    assert (await b.acquire() or 0) > (token or 0)


async def test_many_contenders_exactly_one_wins(redis: Redis, unique: str) -> None:
    leases = [RedisLease(redis, f"c-{unique}", f"owner-{i}", ttl_ms=5_000) for i in range(20)]
    tokens = await asyncio.gather(*(lease.acquire() for lease in leases))
    assert sum(token is not None for token in tokens) == 1


def test_owner_with_separator_is_rejected() -> None:
    with pytest.raises(ValueError):
        RedisLease(None, "x", "a|b", ttl_ms=10)  # type: ignore[arg-type]
