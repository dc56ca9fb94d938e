"""Contract of the Redis lease with fencing tokens (real Redis)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from backbone.db import open_pool
from backbone.lease import PgFence, RedisLease, StaleOwner, check_fence, fenced

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


# ---------------------------------------------------------------------------------- fencing through PostgreSQL


class PrivateRedis:
    """A Redis of the test's own (no persistence): wiped or restarted without touching the shared one."""

    def __init__(self, server: str, workdir: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._server = server
        self._workdir = workdir
        self._process = self._start()
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def _start(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [self._server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            cwd=self._workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as probe, contextlib.suppress(OSError):
                probe.connect(("127.0.0.1", self.port))
                return process
            time.sleep(0.05)
        process.kill()
        raise RuntimeError("the private redis-server did not start")

    def restart(self) -> None:
        """Kill -9 and start again: every key is gone (no persistence)."""
        self.stop()
        self._process = self._start()

    def stop(self) -> None:
        self._process.kill()
        self._process.wait()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (scripts/infra installs it)")
    redis = PrivateRedis(server, tmp_path)
    try:
        yield redis
    finally:
        redis.stop()


@pytest.fixture
async def fence_pool(dsn: str, schema: str) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_pool(dsn, schema=schema, min_size=1, max_size=4)
    async with pool.connection() as conn:
        await PgFence.setup(conn)
    yield pool
    await pool.close()


async def test_wiping_redis_never_yields_a_smaller_token(
    private_redis: PrivateRedis, fence_pool: AsyncConnectionPool
) -> None:
    redis = Redis.from_url(private_redis.url)
    try:
        tokens = []
        for owner in ("a", "b", "c"):
            lease = RedisLease(redis, "table:t1", owner, ttl_ms=5_000, fence=PgFence(fence_pool, "table:t1"))
            token = await lease.acquire()
            assert token is not None
            tokens.append(token)
            assert await lease.holder() == (owner, token)
            await redis.flushall()  # Redis loses everything: the lease and any counter it kept
            assert await lease.renew() is False  # the owner learns it lost the lease
        private_redis.restart()  # and a restart without persistence loses it again
        await redis.aclose()
        redis = Redis.from_url(private_redis.url)
        after_restart = await RedisLease(
            redis, "table:t1", "d", ttl_ms=5_000, fence=PgFence(fence_pool, "table:t1")
        ).acquire()
        assert after_restart is not None
        tokens.append(after_restart)
        assert tokens == sorted(set(tokens)), tokens  # strictly growing: 1, 2, 3, 4
    finally:
        await redis.aclose()


async def test_a_fenced_lease_is_still_exclusive_and_keeps_its_token(
    private_redis: PrivateRedis, fence_pool: AsyncConnectionPool
) -> None:
    redis = Redis.from_url(private_redis.url)
    try:
        a = RedisLease(redis, "relay:x", "a", ttl_ms=300, fence=PgFence(fence_pool, "relay:x"))
        b = RedisLease(redis, "relay:x", "b", ttl_ms=300, fence=PgFence(fence_pool, "relay:x"))
        first = await a.acquire()
        assert first is not None
        assert await b.acquire() is None
        assert await a.acquire() == first
        await asyncio.sleep(0.45)
        second = await b.acquire()
        assert second is not None and second > first
        assert await a.renew() is False
        contenders = [
            RedisLease(redis, "relay:y", f"o{i}", ttl_ms=5_000, fence=PgFence(fence_pool, "relay:y")) for i in range(10)
        ]
        won = await asyncio.gather(*(lease.acquire() for lease in contenders))
        assert sum(token is not None for token in won) == 1
    finally:
        await redis.aclose()


async def test_a_stale_owners_write_is_refused(private_redis: PrivateRedis, fence_pool: AsyncConnectionPool) -> None:
    """Owner a keeps running after Redis forgot its lease; b takes over: a's next fenced write is refused."""
    redis = Redis.from_url(private_redis.url)
    try:
        async with fence_pool.connection() as conn:
            await conn.execute("CREATE TABLE writes (token BIGINT NOT NULL, what TEXT NOT NULL)")
            await conn.commit()

        async def write(token: int, what: str) -> None:
            async with fence_pool.connection() as conn, conn.transaction():
                await conn.execute("INSERT INTO writes VALUES (%s, %s)", (token, what))
                with fenced(PgFence(fence_pool, "table:t2"), token):
                    await check_fence(conn)

        a = RedisLease(redis, "table:t2", "a", ttl_ms=5_000, fence=PgFence(fence_pool, "table:t2"))
        token_a = await a.acquire()
        assert token_a is not None
        await write(token_a, "a1")
        await redis.flushall()
        b = RedisLease(redis, "table:t2", "b", ttl_ms=5_000, fence=PgFence(fence_pool, "table:t2"))
        token_b = await b.acquire()
        assert token_b is not None and token_b > token_a
        with pytest.raises(StaleOwner) as refused:
            await write(token_a, "a2")
        assert refused.value.reason == "STALE_OWNER"
        await write(token_b, "b1")
        async with fence_pool.connection() as conn:
            cur = await conn.execute("SELECT what FROM writes ORDER BY what")
            assert [row[0] for row in await cur.fetchall()] == ["a1", "b1"]  # a2 was rolled back
    finally:
        await redis.aclose()


async def test_a_new_owner_waits_for_the_old_owners_write_in_flight(fence_pool: AsyncConnectionPool) -> None:
    """The increment waits for a fenced write in flight, so the old owner's write commits before the new token."""
    fence = PgFence(fence_pool, "table:t3")
    first = await fence.next_token()
    order: list[str] = []
    async with fence_pool.connection() as conn, conn.transaction():
        await fence.check(conn, first)  # the old owner's write holds the fence row shared
        taking_over = asyncio.create_task(fence.next_token())
        await asyncio.sleep(0.3)
        assert not taking_over.done()  # the new owner waits for it
        order.append("old write committed")
    second = await taking_over
    order.append("new token")
    assert second == first + 1 and order == ["old write committed", "new token"]


async def test_a_lease_renewed_every_so_often_asks_redis_only_then(
    redis: Redis, fence_pool: AsyncConnectionPool
) -> None:
    """``renew_every_ms``: between confirmations ``renew`` trusts the last one; then it asks Redis again."""
    name = f"relay:every-{time.monotonic_ns()}"
    a = RedisLease(redis, name, "a", ttl_ms=3_000, fence=PgFence(fence_pool, name), renew_every_ms=300)
    assert await a.acquire() is not None
    await redis.delete(a.key)  # Redis forgets the lease (a FLUSHALL, a restart)
    assert await a.renew()  # within 300 ms of the acquisition: not asked
    await asyncio.sleep(0.35)
    assert await a.renew() is False  # asked again: the owner learns it lost the lease
    with pytest.raises(ValueError):
        RedisLease(redis, name, "b", ttl_ms=3_000, renew_every_ms=300)  # only with a fence
    with pytest.raises(ValueError):
        RedisLease(redis, name, "b", ttl_ms=600, fence=PgFence(fence_pool, name), renew_every_ms=300)
