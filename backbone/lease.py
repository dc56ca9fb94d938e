"""A Redis lease with fencing tokens: one owner at a time for a named resource.

``acquire`` returns a fencing token that grows with every new owner, so work
done under a lease can be stamped with it and a stale owner (paused past its
lease, or left running while Redis forgot it) is refused downstream.

Redis is only coordination here. With a ``PgFence`` (what every service uses) the
token comes from a row in the owner's own PostgreSQL database, incremented by
each new owner, so it never goes backwards whatever Redis loses (a restart, a
FLUSHALL); and every fenced write checks the row in its own transaction
(``PgFence.check``): a write stamped with an older token than the row's is
refused. The new owner's increment waits for the share locks of writes in
flight, so once it has its token no older owner's write can still commit.
Without a fence (unit tests) the token is a Redis counter: monotonic only while
Redis keeps its data.

``PartitionLeases`` divides a group's partitions (a relay's, a consumer's) among its
live members, one fenced lease per partition (docs/decisions/0011-partition-ownership.md).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager

import psycopg
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from backbone.db import run_ddl
from backbone.errors import FailedPrecondition

FENCE_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS lease_fences (
        name   TEXT PRIMARY KEY,
        token  BIGINT NOT NULL CHECK (token > 0)
    )
    """,
)

FENCE_LOCK_TIMEOUT = "2s"
"""How long a new owner waits for an older owner's writes in flight before it gives up (and tries again)."""

# Both take a free key, or renew it for its owner: KEYS[1] lease key; ARGV[1] owner, ARGV[2] ttl_ms.
# They return our token, or false when another owner holds the key.
_HELD = """
local current = redis.call('GET', KEYS[1])
if current then
  local owner, token = string.match(current, '^(.*)|(%d+)$')
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(token)
  end
  return false
end
"""

# Unfenced: the token is the Redis counter KEYS[2].
_ACQUIRE = (
    _HELD
    + """
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
return token
"""
)

# Fenced: take the key with the placeholder token 0 (0: reserved, the token comes from PostgreSQL next).
_RESERVE = (
    _HELD
    + """
redis.call('SET', KEYS[1], ARGV[1] .. '|0', 'PX', ARGV[2])
return 0
"""
)

# KEYS[1] lease key; ARGV[1] owner|0, ARGV[2] owner|token, ARGV[3] ttl_ms.
_CONFIRM = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""

# KEYS[1] lease key; ARGV[1] owner|token, ARGV[2] ttl_ms.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class StaleOwner(FailedPrecondition):
    """A write stamped with a fencing token older than the resource's: another owner has taken over."""


class PgFence:
    """The fencing token of ``name``, kept in a row of the owner's PostgreSQL database."""

    def __init__(self, pool: AsyncConnectionPool, name: str) -> None:
        self._pool = pool
        self.name = name

    @staticmethod
    async def setup(conn: psycopg.AsyncConnection) -> None:
        await run_ddl(conn, FENCE_SCHEMA)

    async def next_token(self) -> int:
        """A token greater than every token handed out before (waits for writes of older owners in flight)."""
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(f"SET LOCAL lock_timeout = '{FENCE_LOCK_TIMEOUT}'")
            cur = await conn.execute(
                "INSERT INTO lease_fences (name, token) VALUES (%s, 1)"
                " ON CONFLICT (name) DO UPDATE SET token = lease_fences.token + 1 RETURNING token",
                (self.name,),
            )
            row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def current(self) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT token FROM lease_fences WHERE name = %s", (self.name,))
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def check(self, conn: psycopg.AsyncConnection, token: int) -> None:
        """In the write's transaction: refuse it unless ``token`` is the newest (keeps a share lock to commit)."""
        cur = await conn.execute("SELECT token FROM lease_fences WHERE name = %s FOR SHARE", (self.name,))
        row = await cur.fetchone()
        newest = int(row[0]) if row else 0
        if token < newest:
            raise StaleOwner(
                "STALE_OWNER", f"{self.name}: fencing token {token} is older than the current owner's {newest}"
            )


_fenced: contextvars.ContextVar[tuple[PgFence, int] | None] = contextvars.ContextVar("fenced", default=None)


@contextmanager
def fenced(fence: PgFence, token: int) -> Iterator[None]:
    """Writes in this context (and the tasks it starts) are made under ``fence`` with ``token``."""
    reset = _fenced.set((fence, token))
    try:
        yield
    finally:
        _fenced.reset(reset)


async def check_fence(conn: psycopg.AsyncConnection) -> None:
    """Refuse the transaction's write if the current context acts for an owner that was superseded."""
    current = _fenced.get()
    if current is not None:
        fence, token = current
        await fence.check(conn, token)


class RedisLease:
    """Lease ``name`` for ``owner``; call ``renew`` well within ``ttl_ms``.

    With ``fence`` the tokens come from PostgreSQL and never go backwards; without, from Redis.

    ``renew_every_ms`` (fenced leases only): ``renew`` asks Redis only when the lease was last
    confirmed longer ago than this, so an owner that checks its lease in a tight loop does not
    pay a Redis round trip each time. It may then act
    on a lease it lost for up to that long; its fenced writes are refused all the same.
    """

    def __init__(
        self,
        redis: Redis,
        name: str,
        owner: str,
        ttl_ms: int,
        *,
        fence: PgFence | None = None,
        renew_every_ms: int = 0,
    ) -> None:
        if "|" in owner:
            raise ValueError("owner must not contain '|'")
        if ttl_ms <= 0:
            raise ValueError("ttl_ms must be positive")
        if renew_every_ms and (fence is None or not 0 < renew_every_ms <= ttl_ms // 3):
            raise ValueError("renew_every_ms needs a fence and must leave three renewals within ttl_ms")
        self._redis = redis
        self.name = name
        self.key = f"niuniu:lease:{name}"
        self._fence_key = f"niuniu:fence:{name}"
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.fence = fence
        self.token: int | None = None
        self._renew_every_s = renew_every_ms / 1000
        self._confirmed_at = float("-inf")

    async def acquire(self) -> int | None:
        """Take the lease if free (or already ours): the fencing token, else None."""
        if self.fence is None:
            result = await self._redis.eval(_ACQUIRE, 2, self.key, self._fence_key, self.owner, self.ttl_ms)
            self.token = int(result) if result else None
            return self.token
        result = await self._redis.eval(_RESERVE, 1, self.key, self.owner, self.ttl_ms)
        if result is None:
            self.token = None
            return None
        token = int(result)
        if token == 0:  # reserved: the token comes from PostgreSQL
            try:
                token = await self.fence.next_token()
            except BaseException:
                await self._redis.eval(_RELEASE, 1, self.key, f"{self.owner}|0")
                raise
            confirmed = await self._redis.eval(
                _CONFIRM, 1, self.key, f"{self.owner}|0", f"{self.owner}|{token}", self.ttl_ms
            )
            if not confirmed:  # the reservation expired meanwhile (or Redis lost it): not ours
                self.token = None
                return None
        self.token = token
        self._confirmed_at = time.monotonic()
        return self.token

    async def renew(self) -> bool:
        """Extend the lease; False means it was lost and the caller must stop acting as owner."""
        if self.token is None:
            return False
        if time.monotonic() - self._confirmed_at < self._renew_every_s:
            return True
        ok = await self._redis.eval(_RENEW, 1, self.key, self._value(), self.ttl_ms)
        if not ok:
            self.token = None
        else:
            self._confirmed_at = time.monotonic()
        return bool(ok)

    async def release(self) -> bool:
        if self.token is None:
            return False
        ok = await self._redis.eval(_RELEASE, 1, self.key, self._value())
        self.token = None
        return bool(ok)

    async def holder(self) -> tuple[str, int] | None:
        raw = await self._redis.get(self.key)
        if raw is None:
            return None
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        owner, _, token = text.rpartition("|")
        return owner, int(token)

    def _value(self) -> str:
        return f"{self.owner}|{self.token}"


Part = tuple[str, int]
"""A partition of a topic: (topic, partition); Kafka's ``TopicPartition`` is one."""

# KEYS[1] the group's members (a sorted set scored by last heartbeat, Redis's clock); ARGV[1] owner,
# ARGV[2] ttl_ms, ARGV[3] '1' to stay a member, '0' to leave. Drops members silent for ttl_ms and
# returns the live ones.
_MEMBERS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[1], now, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

MAX_GROUP_PARTITIONS = 1_000
"""Bound on the partitions one group divides (``backbone.topics.MAX_PARTITIONS`` of one topic)."""


class StalePartitions(StaleOwner):
    """Fenced writes for partitions whose lease another owner has taken since."""

    def __init__(self, parts: Collection[Part], detail: str) -> None:
        super().__init__("STALE_OWNER", detail)
        self.parts = frozenset(parts)


def share(parts: Collection[Part], members: Sequence[str], owner: str) -> frozenset[Part]:
    """``owner``'s share of ``parts`` among ``members``: the i-th partition (by topic, then number) goes
    to the (i mod n)-th member (by name).

    Every member computes the same division from the same list; each gets ⌊P/n⌋ or ⌈P/n⌉ of the
    partitions, and of each topic's as many as any other member give or take one (a topic's
    partitions are consecutive in the order)."""
    ordered = sorted(set(members))
    if owner not in ordered:
        return frozenset()
    mine = ordered.index(owner)
    return frozenset(part for i, part in enumerate(sorted(parts)) if i % len(ordered) == mine)


class PartitionLeases:
    """This owner's share of a group's partitions, one fenced lease per partition.

    The members of ``group`` (every replica of a service's relay, or of one of its consumers)
    heartbeat into a Redis sorted set; each ``refresh`` divides the partitions among the live
    members (``share``), gives up the leases of partitions no longer its own, and takes those of
    its share once their previous owner has let them go (at its own next refresh) or its lease ran
    out (it died). A member that stops (``leave``) hands its partitions over at the others' next
    refresh; one that dies, within ``ttl_ms`` and a refresh.

    Each partition's lease is a ``RedisLease`` whose fencing token comes from PostgreSQL
    (``PgFence`` named ``<group>:<topic>:<partition>``); writes for a partition check it in their
    own transaction (``check``), so an owner deposed without noticing commits nothing for it.
    """

    def __init__(self, redis: Redis, group: str, owner: str, ttl_ms: int, pool: AsyncConnectionPool) -> None:
        if "|" in owner:
            raise ValueError("owner must not contain '|'")
        if ttl_ms <= 0:
            raise ValueError("ttl_ms must be positive")
        self._redis = redis
        self._pool = pool
        self.group = group
        self.owner = owner
        self.ttl_ms = ttl_ms
        self._members_key = f"niuniu:members:{group}"
        self._held: dict[Part, RedisLease] = {}

    @property
    def held(self) -> frozenset[Part]:
        return frozenset(self._held)

    def fence_name(self, part: Part) -> str:
        return f"{self.group}:{part[0]}:{part[1]}"

    async def members(self) -> list[str]:
        """The live members (this one included: it heartbeats)."""
        raw = await self._redis.eval(_MEMBERS, 1, self._members_key, self.owner, self.ttl_ms, "1")
        return [m.decode() if isinstance(m, bytes) else str(m) for m in raw]

    async def refresh(self, parts: Collection[Part]) -> frozenset[Part]:
        """Heartbeat, then hold this owner's share of ``parts`` (as far as their leases are free).

        Returns the partitions held. Raises when Redis cannot be reached: the caller keeps acting
        for what it held (its writes are fenced whatever Redis says)."""
        if len(parts) > MAX_GROUP_PARTITIONS:
            raise ValueError(f"a group divides at most {MAX_GROUP_PARTITIONS} partitions")
        mine = share(parts, await self.members(), self.owner)
        for part in sorted(self.held - mine):
            await self._held.pop(part).release()
        for part, lease in sorted(self._held.items()):
            if not await lease.renew():
                del self._held[part]
        for part in sorted(mine - self.held):
            lease = RedisLease(self._redis, self.fence_name(part), self.owner, self.ttl_ms, fence=self._fence(part))
            if await lease.acquire() is not None:
                self._held[part] = lease
        return self.held

    def lose(self, parts: Collection[Part]) -> None:
        """Forget ``parts`` (their fences refused a write): another owner holds them now."""
        for part in parts:
            self._held.pop(part, None)

    async def leave(self) -> None:
        """Give every lease up and leave the group, so the others take the partitions at once."""
        for lease in self._held.values():
            await lease.release()
        self._held.clear()
        await self._redis.eval(_MEMBERS, 1, self._members_key, self.owner, self.ttl_ms, "0")

    async def check(self, conn: psycopg.AsyncConnection, parts: Collection[Part]) -> None:
        """In a write's transaction: refuse it unless this owner holds every one of ``parts`` under its
        newest token (share locks on their fences, kept to commit, so no new owner's token comes
        between this check and the commit)."""
        tokens = {self.fence_name(p): (p, self._held[p].token if p in self._held else None) for p in parts}
        cur = await conn.execute(
            "SELECT name, token FROM lease_fences WHERE name = ANY(%s) ORDER BY name FOR SHARE", (sorted(tokens),)
        )
        newest = {str(name): int(token) for name, token in await cur.fetchall()}
        stale = [part for name, (part, token) in tokens.items() if token is None or token < newest.get(name, 0)]
        if stale:
            raise StalePartitions(stale, f"{self.group}: partitions {sorted(stale)} have another owner now")

    def _fence(self, part: Part) -> PgFence:
        return PgFence(self._pool, self.fence_name(part))
