"""Relays and exactly-once consumers divide their partitions among the live replicas of a service.

Against the real Kafka, PostgreSQL and Redis: two relays over one outbox publish a share each and
together every row once, in version order per stream; two consumers apply a share each and every
event once; a replica that stops, or dies, hands its partitions over within a bounded time; an owner
deposed without noticing commits nothing (the partitions' fencing tokens).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from credits_projection import CREDITS_DDL, apply_credit, credited, credits
from kafka import KafkaConsumer, TopicPartition
from kafka.partitioner.default import murmur2 as kafka_murmur2
from niuniu.v1 import events_pb2
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from backbone.consumer import ExactlyOnceConsumer
from backbone.db import open_pool, run_ddl
from backbone.eventstore import EventStore
from backbone.kafka import TopicSpec, ensure_topics, make_consumer, make_producer
from backbone.keyhash import key_hash, murmur2
from backbone.lease import PartitionLeases, PgFence, StalePartitions, share
from backbone.relay import OutboxRelay, PendingRecord

PARTITIONS = 4
TTL_MS = 1_500
"""The test's lease time to live: a dead replica's partitions move within it and a refresh (a third)."""
TAKEOVER_BOUND_S = TTL_MS / 1000 + TTL_MS / 3000 + 2.0
"""What a takeover may take: the lease running out, the survivor's next refresh, and a margin for the
broker's first fetch of the partitions."""
DEADLINE_S = 60.0


def test_the_outbox_hash_is_kafkas_murmur2() -> None:
    """The row's partition is the one Kafka's default partitioner (kafka-python's, Java's) gives its key."""
    rng = random.Random(47)
    keys = [bytes(rng.randrange(256) for _ in range(n)) for n in range(40) for _ in range(25)]
    keys += [b"table-7", b"table-7.bet-42", "acct-\u00e9".encode()]
    for key in keys:
        assert murmur2(key) & 0x7FFFFFFF == kafka_murmur2(key) & 0x7FFFFFFF, key
    assert key_hash("table-7") == kafka_murmur2(b"table-7") & 0x7FFFFFFF


def test_the_share_divides_every_partition_once_and_evenly() -> None:
    parts = [("a", p) for p in range(6)] + [("b", p) for p in range(3)]
    members = ["m2", "m1", "m3", "m4"]
    shares = {m: share(parts, members, m) for m in members}
    assert sorted(p for s in shares.values() for p in s) == sorted(parts)  # each once
    assert {len(s) for s in shares.values()} <= {2, 3}  # 9 over 4: two or three each
    for topic, count in (("a", 6), ("b", 3)):
        per_member = [sum(1 for t, _ in s if t == topic) for s in shares.values()]
        assert max(per_member) - min(per_member) <= 1 and sum(per_member) == count
    assert share(parts, members, "not-a-member") == frozenset()
    assert share(parts, list(reversed(members)), "m1") == shares["m1"]  # the order of the list is no matter


@pytest.fixture
async def pool(dsn: str, schema: str) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_pool(dsn, schema=schema, max_size=10)
    async with pool.connection() as conn:
        await run_ddl(conn, CREDITS_DDL)
        await ExactlyOnceConsumer.setup(conn)
        await PgFence.setup(conn)
    yield pool
    await pool.close()


@pytest.fixture
def topic(kafka_servers: str, unique: str) -> str:
    name = f"test.parts.{unique}"
    ensure_topics(kafka_servers, [TopicSpec(name, partitions=PARTITIONS)])
    return name


@pytest.fixture
async def store(pool: AsyncConnectionPool, topic: str) -> EventStore:
    store = EventStore("test", topic)
    async with pool.connection() as conn:
        await store.setup(conn)
    return store


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def append_credits(pool: AsyncConnectionPool, store: EventStore, n: int, streams: int = 16) -> None:
    """``n`` credits over ``streams`` accounts (each its own stream), in turn."""
    async with pool.connection() as conn, conn.transaction():
        for i in range(n):
            account = f"acct-{i % streams}"
            await store.append(conn, account, i // streams, [credited(account, i + 1)])


def expected_totals(n: int, streams: int = 16) -> dict[str, tuple[int, int]]:
    totals: dict[str, tuple[int, int]] = {}
    for i in range(n):
        total, count = totals.get(f"acct-{i % streams}", (0, 0))
        totals[f"acct-{i % streams}"] = (total + i + 1, count + 1)
    return totals


def read_topic(kafka_servers: str, topic: str) -> dict[int, list[events_pb2.EventEnvelope]]:
    """Every record on the topic, by partition, in offset order."""
    consumer: KafkaConsumer = make_consumer(kafka_servers, None, "read-all")
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(parts)
        out: dict[int, list[events_pb2.EventEnvelope]] = {p.partition: [] for p in parts}
        deadline = time.monotonic() + DEADLINE_S
        while any(consumer.position(p) < ends[p] for p in parts) and time.monotonic() < deadline:
            for tp, records in consumer.poll(500).items():
                for record in records:
                    envelope = events_pb2.EventEnvelope()
                    envelope.ParseFromString(record.value)
                    out[tp.partition].append(envelope)
        return out
    finally:
        consumer.close()


async def settle(*sides: PartitionLeases | OutboxRelay | ExactlyOnceConsumer, rounds: int = 3) -> None:
    """Refresh each side in turn a few times: joining members see each other, owners hand over."""
    for _ in range(rounds):
        for side in sides:
            if isinstance(side, OutboxRelay):
                await side.refresh(force=True)
            elif isinstance(side, ExactlyOnceConsumer):
                side._shared_at = float("-inf")
                await side.poll_once()
            else:
                raise TypeError(side)


def relay(name: str, pool: AsyncConnectionPool, redis: Redis, unique: str, topic: str, kafka: str) -> OutboxRelay:
    leases = PartitionLeases(redis, f"relay:{unique}", name, TTL_MS, pool)
    return OutboxRelay("test", pool, make_producer(kafka, f"relay-{name}"), leases=leases, topics=[topic], batch_size=7)


async def test_two_relays_publish_a_share_each_and_every_row_once_in_order(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str, redis: Redis
) -> None:
    await append_credits(pool, store, 96)
    a, b = (relay(n, pool, redis, unique, topic, kafka_servers) for n in ("a", "b"))
    await settle(a, b)
    assert a._leases is not None and b._leases is not None
    assert len(a._leases.held) == len(b._leases.held) == PARTITIONS // 2
    assert not a._leases.held & b._leases.held
    published: dict[str, list[PendingRecord]] = {"a": [], "b": []}
    for name, side in (("a", a), ("b", b)):

        async def note(batch: list[PendingRecord], name: str = name) -> None:
            published[name].extend(batch)

        side.after_publish = note
    while await a.publish_once() + await b.publish_once():
        pass
    assert published["a"] and published["b"]
    assert {r.partition for r in published["a"]} == {p for _, p in a._leases.held}
    positions = [r.position for side in published.values() for r in side]
    assert len(positions) == len(set(positions)) == 96  # together, every row once
    on_topic = read_topic(kafka_servers, topic)
    assert sum(len(records) for records in on_topic.values()) == 96
    for partition, records in on_topic.items():
        versions: dict[str, list[int]] = {}
        for envelope in records:
            assert key_hash(envelope.stream_id) % PARTITIONS == partition
            versions.setdefault(envelope.stream_id, []).append(envelope.stream_version)
        for stream, seen in versions.items():
            assert seen == list(range(1, len(seen) + 1)), stream  # in version order, none missing


async def test_a_deposed_relay_publishes_nothing_of_the_partitions_it_lost(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str, redis: Redis
) -> None:
    """Redis forgets the relay (a restart, a FLUSHALL) and another takes every partition: the first relay's
    next batch is refused by the partitions' fences, and it lets them go."""
    await append_credits(pool, store, 20)
    old, new = (relay(n, pool, redis, unique, topic, kafka_servers) for n in ("old", "new"))
    await settle(old)
    assert old._leases is not None and new._leases is not None
    await redis.delete(
        f"niuniu:members:relay:{unique}", *(f"niuniu:lease:relay:{unique}:{t}:{p}" for t, p in old._leases.held)
    )
    await settle(new, rounds=1)
    assert len(new._leases.held) == PARTITIONS
    with pytest.raises(StalePartitions) as refused:
        await old.publish_once()
    assert refused.value.parts == old._leases.held
    assert sum(len(r) for r in read_topic(kafka_servers, topic).values()) == 0
    while await new.publish_once():
        pass
    assert sum(len(r) for r in read_topic(kafka_servers, topic).values()) == 20


def leased_consumer(
    owner: str, pool: AsyncConnectionPool, redis: Redis, unique: str, topic: str, kafka: str
) -> ExactlyOnceConsumer:
    name = f"g-{unique}"
    leases = PartitionLeases(redis, f"consumer:{name}", owner, TTL_MS, pool)
    client = make_consumer(kafka, name, f"{name}-{owner}")
    return ExactlyOnceConsumer(name, [topic], pool, apply_credit, client, leases=leases, batch_size=5)


def counting(consumer: ExactlyOnceConsumer, counter: Counter[str], owner: str) -> None:
    async def count(record: Any) -> None:
        counter[owner] += 1

    consumer.after_commit = count


async def applied_total(pool: AsyncConnectionPool) -> int:
    async with pool.connection() as conn:
        return sum(applied for _, applied in (await credits(conn)).values())


async def publish_all(pool: AsyncConnectionPool, kafka_servers: str) -> None:
    plain = OutboxRelay("test", pool, make_producer(kafka_servers, "relay"), batch_size=1_000)
    while await plain.publish_once():
        pass


async def test_two_consumers_apply_a_share_each_and_every_event_once(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str, redis: Redis
) -> None:
    a, b = (leased_consumer(n, pool, redis, unique, topic, kafka_servers) for n in ("a", "b"))
    await settle(a, b)  # before the events: the first to join holds every partition until the other joins
    await append_credits(pool, store, 120)
    await publish_all(pool, kafka_servers)
    assert a._assignment and b._assignment and not a._assignment & b._assignment
    assert len(a._assignment) == len(b._assignment) == PARTITIONS // 2
    applied: Counter[str] = Counter()
    counting(a, applied, "a")
    counting(b, applied, "b")
    deadline = time.monotonic() + DEADLINE_S
    while await applied_total(pool) < 120 and time.monotonic() < deadline:
        await asyncio.gather(a.poll_once(), b.poll_once())
    for _ in range(3):
        await asyncio.gather(a.poll_once(), b.poll_once())
    async with pool.connection() as conn:
        assert await credits(conn) == expected_totals(120)  # each once: totals and counts exact
    assert applied["a"] > 0 and applied["b"] > 0
    a._kafka.close()
    b._kafka.close()


@pytest.mark.parametrize("how", ["stopped", "died"])
async def test_a_consumer_that_goes_hands_its_partitions_over_within_the_bound(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str, redis: Redis, how: str
) -> None:
    """Stopped: it leaves the group and the other takes over at its next refresh. Died: nothing said,
    its leases run out first. Either way nothing is lost or applied twice."""
    goner, survivor = (leased_consumer(n, pool, redis, unique, topic, kafka_servers) for n in ("goner", "survivor"))
    stop_goner, stop_survivor = asyncio.Event(), asyncio.Event()
    await settle(goner, survivor)
    await append_credits(pool, store, 60)
    await publish_all(pool, kafka_servers)
    running = [asyncio.create_task(goner.run(stop_goner)), asyncio.create_task(survivor.run(stop_survivor))]
    try:
        deadline = time.monotonic() + DEADLINE_S
        while await applied_total(pool) < 30 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if how == "stopped":
            stop_goner.set()
            await running[0]
        else:
            running[0].cancel()  # no leave, no release: its leases run out
            await asyncio.gather(running[0], return_exceptions=True)
        gone_at = time.monotonic()
        await append_credits_after(pool, store, 60, 40)
        await publish_all(pool, kafka_servers)
        while await applied_total(pool) < 100 and time.monotonic() - gone_at < DEADLINE_S:
            await asyncio.sleep(0.05)
        took = time.monotonic() - gone_at
        print(f"{how}: the survivor applied everything {took:.2f}s after the other went")
        assert len(survivor._assignment) == PARTITIONS
        assert took < TAKEOVER_BOUND_S
        async with pool.connection() as conn:
            assert await credits(conn) == expected_totals(100)
    finally:
        stop_survivor.set()
        await asyncio.gather(*running, return_exceptions=True)
        if how == "died":
            goner._kafka.close(autocommit=False)  # its poll, cancelled on the loop, has ended in its thread


async def append_credits_after(pool: AsyncConnectionPool, store: EventStore, first: int, n: int) -> None:
    """Credits ``first`` .. ``first + n - 1`` of the sequence ``append_credits`` starts."""
    async with pool.connection() as conn, conn.transaction():
        for i in range(first, first + n):
            account = f"acct-{i % 16}"
            await store.append(conn, account, i // 16, [credited(account, i + 1)])


async def test_a_deposed_consumers_late_commit_is_refused(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str, redis: Redis
) -> None:
    """The owner pauses past its leases (here: Redis forgets them) and another takes its partitions and
    applies: the first one's commit, when it wakes, is refused, and it applies nothing twice."""
    old, new = (leased_consumer(n, pool, redis, unique, topic, kafka_servers) for n in ("old", "new"))
    await settle(old, rounds=1)
    assert old._leases is not None and len(old._assignment) == PARTITIONS
    old._shared_at = time.monotonic() + DEADLINE_S  # it does not look at its leases again: paused
    await append_credits(pool, store, 40)
    await publish_all(pool, kafka_servers)
    keys = [f"niuniu:lease:consumer:g-{unique}:{t}:{p}" for t, p in old._leases.held]
    await redis.delete(f"niuniu:members:consumer:g-{unique}", *keys)
    deadline = time.monotonic() + DEADLINE_S
    while await applied_total(pool) < 40 and time.monotonic() < deadline:
        await new.poll_once()
    assert len(new._assignment) == PARTITIONS
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT count(*), min(token), max(token) FROM lease_fences")
        assert await cur.fetchone() == (PARTITIONS, 2, 2)  # each partition's second owner
    for _ in range(20):  # until its poll brings records: they are refused by the fences, not applied
        assert await old.poll_once() == 0
        if not old._leases.held:
            break
    assert old._leases.held == frozenset()
    async with pool.connection() as conn:
        assert await credits(conn) == expected_totals(40)
        cur = await conn.execute("SELECT count(*) FROM processed_events")
        assert await cur.fetchone() == (40,)
    old._kafka.close()
    new._kafka.close()
