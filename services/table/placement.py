"""Which table replica runs which table: live members in Redis, a balanced rendezvous assignment.

Every replica announces itself with a Redis key of its own that expires (``Membership.beat``,
renewed as often as a table lease, with the same time to live), so the live members are the
keys still there. A replica that dies stops renewing and drops out within that time; one that
stops deletes its key at once. Redis holds nothing else here: if it loses the keys, the next
beat of every replica writes them again.

``assign`` is a pure function of the open tables and the live members, so every replica
computes the same owners without talking to the others. It is rendezvous hashing (each table
goes to the member with the highest weight ``hash(member, table)``) with a quota of
⌊tables / members⌋ or one more per member: plain rendezvous hashing spreads tables binomially (3 members
over 12 tables: some member has 2 or fewer, or 7 or more, in about half of the memberships);
the quota keeps every member within one table of the others. A member joining or leaving moves
the tables whose winner changed, and the few the quotas push along (about one on average).

The assignment says which replica should take a table; the table's lease (``runner``) still
decides who does, so two replicas that briefly disagree about the members never both run it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from redis.asyncio import Redis

# KEYS[1] the members' index (a set of names); ARGV[1] the prefix of the members' keys,
# ARGV[2] this member, ARGV[3] ttl_ms. Renews this member's key, drops the names whose key
# expired, and returns the live members.
_BEAT = """
redis.call('SET', ARGV[1] .. ARGV[2], '1', 'PX', ARGV[3])
redis.call('SADD', KEYS[1], ARGV[2])
local live = {}
for _, name in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('EXISTS', ARGV[1] .. name) == 1 then
    table.insert(live, name)
  else
    redis.call('SREM', KEYS[1], name)
  end
end
return live
"""

# KEYS[1] the members' index; ARGV[1] the prefix of the members' keys, ARGV[2] this member.
_LEAVE = """
redis.call('DEL', ARGV[1] .. ARGV[2])
redis.call('SREM', KEYS[1], ARGV[2])
return 1
"""


class Membership:
    """``member``'s place among the live replicas of ``group``; ``beat`` well within ``ttl_ms``."""

    def __init__(self, redis: Redis, group: str, member: str, ttl_ms: int) -> None:
        if ttl_ms <= 0:
            raise ValueError("ttl_ms must be positive")
        self._redis = redis
        # One hash tag: the index and the members' keys live in one Redis Cluster slot, as the scripts need.
        self.index_key = f"niuniu:members:{{{group}}}"
        self.member_prefix = f"niuniu:member:{{{group}}}:"
        self.member = member
        self.ttl_ms = ttl_ms

    async def beat(self) -> list[str]:
        """Announce this member for another ``ttl_ms``; the live members, sorted (this one among them)."""
        live = await self._redis.eval(_BEAT, 1, self.index_key, self.member_prefix, self.member, self.ttl_ms)
        return sorted(name.decode() if isinstance(name, bytes) else str(name) for name in live)

    async def leave(self) -> None:
        """Stop being a member now, rather than when the key expires."""
        await self._redis.eval(_LEAVE, 1, self.index_key, self.member_prefix, self.member)


def weight(member: str, table_id: str) -> int:
    """The rendezvous weight: the same on every replica (not Python's salted ``hash``)."""
    digest = hashlib.blake2b(f"{member}\x00{table_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign(table_ids: Iterable[str], members: Iterable[str]) -> dict[str, str]:
    """The owner of each table: its highest-weight member among those still under their quota.

    Every member takes ⌊tables / members⌋, and the first members to get there (as many as the
    division leaves over) one more, so the members' counts differ by at most one. Tables are
    placed in an order of their own hash (not their names, which often share a pattern), so
    the tables a quota pushes to a second choice are a fair sample.
    """
    tables, names = sorted(set(table_ids)), sorted(set(members))
    if not names:
        return {}
    base, extra = divmod(len(tables), len(names))
    load = dict.fromkeys(names, 0)
    owners: dict[str, str] = {}
    for table_id in sorted(tables, key=lambda t: weight("", t)):
        for member in sorted(names, key=lambda m: weight(m, table_id), reverse=True):
            if load[member] == base and extra > 0:
                extra -= 1  # this member takes one of the tables the division leaves over
            elif load[member] >= base:
                continue
            owners[table_id] = member
            load[member] += 1
            break
    return owners
