"""Login and Register throttling, per account (username) and per client address.

Fixed-window counters in Redis (``INCR`` + ``EXPIRE``), so every wallet instance sees
the same counts and memory is bounded by the keys' expiry; identities are hashed, so a
1 MiB username costs a 32-character key. Three limits (``NIUNIU_WALLET_THROTTLE``,
e.g. ``account_failures=5/300,address_failures=30/300,address_attempts=120/60``):

- ``account_failures``: failed Login/Register attempts naming one username; past it
  the username is locked, even with the right password, until the window ends;
- ``address_failures``: failed attempts from one address (guessing across accounts);
- ``address_attempts``: any Login/Register from one address (each costs an argon2 hash).

A refusal is RESOURCE_EXHAUSTED ``TOO_MANY_ATTEMPTS`` with ``retry in N s`` in the
message and ``retry-after-s`` in the trailing metadata (``niuniu-retry-after-s``).

If Redis cannot be reached the counters fall back to a bounded in-process table
(``LOCAL_CAPACITY`` keys, oldest evicted first; Redis is tried again after
``REDIS_RETRY_AFTER_S``): throttling stays on per instance
instead of failing open (no limit) or failing closed (nobody can log in while Redis,
a coordinator that holds nothing durable, is down). The address is the client's as the
browser gateway vouches for it (backbone/clientaddress.py), else the connection's peer.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from backbone.config import ConfigError
from backbone.errors import ResourceExhausted

log = logging.getLogger(__name__)

LOCAL_CAPACITY = 10_000
REDIS_RETRY_AFTER_S = 5.0  # after a Redis failure, count locally this long before trying Redis again
RETRY_AFTER_METADATA_KEY = "niuniu-retry-after-s"
THROTTLE_ENV = "NIUNIU_WALLET_THROTTLE"


@dataclass(frozen=True, slots=True)
class Limit:
    attempts: int
    window_s: int


@dataclass(frozen=True, slots=True)
class ThrottlePolicy:
    account_failures: Limit = Limit(5, 300)
    address_failures: Limit = Limit(30, 300)
    address_attempts: Limit = Limit(120, 60)

    @classmethod
    def from_env(cls) -> ThrottlePolicy:
        raw = os.environ.get(THROTTLE_ENV, "")
        limits = {}
        for part in filter(None, (p.strip() for p in raw.split(","))):
            name, _, value = part.partition("=")
            attempts, _, window = value.partition("/")
            if name not in cls.__dataclass_fields__ or not attempts.isdigit() or not window.isdigit():
                raise ConfigError(f"{THROTTLE_ENV}: expected name=attempts/window_s, not {part[:80]!r}")
            limits[name] = Limit(int(attempts), int(window))
        return cls(**limits)


class TooManyAttempts(ResourceExhausted):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__("TOO_MANY_ATTEMPTS", f"too many attempts; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


def _digest(identity: str) -> str:
    return hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class Throttle:
    def __init__(
        self,
        redis: Redis | None,
        policy: ThrottlePolicy | None = None,
        *,
        prefix: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self.policy = policy or ThrottlePolicy()
        self._prefix = prefix
        self._clock = clock
        self._local: OrderedDict[str, int] = OrderedDict()
        self._redis_down_until = 0.0  # time.monotonic(): a call never waits on a Redis known to be down

    def _key(self, kind: str, identity: str, limit: Limit) -> tuple[str, int]:
        now = self._clock()
        window = int(now // limit.window_s)
        retry_after_s = max(1, int((window + 1) * limit.window_s - now + 0.999))
        return f"{self._prefix}throttle:{kind}:{_digest(identity)}:{window}", retry_after_s

    async def _count(self, key: str, window_s: int, *, increment: bool) -> int:
        if self._redis is not None and time.monotonic() >= self._redis_down_until:
            try:
                if not increment:
                    value = await self._redis.get(key)
                    return int(value or 0)
                async with self._redis.pipeline(transaction=True) as pipe:
                    pipe.incr(key)
                    pipe.expire(key, window_s + 1)
                    count, _ = await pipe.execute()
                return int(count)
            except (RedisError, OSError) as error:
                self._redis_down_until = time.monotonic() + REDIS_RETRY_AFTER_S
                log.warning("throttle: Redis unavailable, counting in this process", extra={"error": str(error)[:200]})
        count = self._local.pop(key, 0) + (1 if increment else 0)
        self._local[key] = count  # most recent last
        while len(self._local) > LOCAL_CAPACITY:
            self._local.popitem(last=False)
        return count

    async def admit(self, account: str, address: str) -> None:
        """Before a Login/Register: counts the attempt; TooManyAttempts when a limit is reached."""
        p = self.policy
        key, retry = self._key("addr-try", address, p.address_attempts)
        if await self._count(key, p.address_attempts.window_s, increment=True) > p.address_attempts.attempts:
            raise TooManyAttempts(retry)
        for kind, identity, limit in self._failure_limits(account, address):
            key, retry = self._key(kind, identity, limit)
            if await self._count(key, limit.window_s, increment=False) >= limit.attempts:
                raise TooManyAttempts(retry)

    def _failure_limits(self, account: str, address: str) -> list[tuple[str, str, Limit]]:
        p = self.policy
        return [("acct-fail", account, p.account_failures), ("addr-fail", address, p.address_failures)]

    async def failed(self, account: str, address: str) -> None:
        for kind, identity, limit in self._failure_limits(account, address):
            key, _ = self._key(kind, identity, limit)
            await self._count(key, limit.window_s, increment=True)


def client_address(peer: str) -> str:
    """``ipv4:1.2.3.4:5678`` -> ``ipv4:1.2.3.4``; ``ipv6:[::1]:5678`` -> ``ipv6:[::1]``."""
    family, _, rest = peer.partition(":")
    if family in ("ipv4", "ipv6"):
        host, _, _port = rest.rpartition(":")
        return f"{family}:{host or rest}"
    return peer[:200]
