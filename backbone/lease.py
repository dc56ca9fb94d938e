"""A Redis lease with fencing tokens: one owner at a time for a named resource.

``acquire`` returns a fencing token that grows with every new owner, so work
done under a lease can be stamped with it and a stale owner (paused past its
lease) is recognisable downstream. Redis is only coordination here: losing it
loses nobody's data, the next acquire simply starts a new generation.
"""

from __future__ import annotations

from redis.asyncio import Redis

# KEYS[1] lease key, KEYS[2] fence counter; ARGV[1] owner, ARGV[2] ttl_ms.
_ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if current then
  local owner, token = string.match(current, '^(.*)|(%d+)$')
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(token)
  end
  return false
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
return token
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


class RedisLease:
    """Lease ``name`` for ``owner``; call ``renew`` well within ``ttl_ms``."""

    def __init__(self, redis: Redis, name: str, owner: str, ttl_ms: int) -> None:
        if "|" in owner:
            raise ValueError("owner must not contain '|'")
        if ttl_ms <= 0:
            raise ValueError("ttl_ms must be positive")
        self._redis = redis
        self.key = f"niuniu:lease:{name}"
        self._fence_key = f"niuniu:fence:{name}"
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.token: int | None = None

    async def acquire(self) -> int | None:
        """Take the lease if free (or already ours): the fencing token, else None."""
        result = await self._redis.eval(_ACQUIRE, 2, self.key, self._fence_key, self.owner, self.ttl_ms)
        self.token = int(result) if result else None
        return self.token

    async def renew(self) -> bool:
        """Extend the lease; False means it was lost and the caller must stop acting as owner."""
        if self.token is None:
            return False
        ok = await self._redis.eval(_RENEW, 1, self.key, self._value(), self.ttl_ms)
        if not ok:
            self.token = None
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
