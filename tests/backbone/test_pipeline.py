"""Outbox relay -> Kafka -> exactly-once consumer, against the real broker and database."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from credits_projection import CREDITS_DDL, apply_credit, apply_credits, credited, credits
from google.protobuf import struct_pb2
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from backbone.consumer import ExactlyOnceConsumer
from backbone.db import open_pool, run_ddl
from backbone.eventstore import MAX_PAYLOAD_BYTES, EventStore, NewEvent
from backbone.handlers import batched, handling
from backbone.kafka import TopicSpec, ensure_topics, make_consumer, make_producer
from backbone.lease import PartitionLeases, PgFence
from backbone.relay import RENEW_PRODUCER_AFTER, OutboxRelay, PendingRecord

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0


class Crash(Exception):
    """Stands for the process dying at a chosen point."""


@pytest.fixture
async def pool(dsn: str, schema: str) -> AsyncIterator[AsyncConnectionPool]:
    pool = await open_pool(dsn, schema=schema, max_size=10)
    async with pool.connection() as conn:
        await run_ddl(conn, CREDITS_DDL)
        await ExactlyOnceConsumer.setup(conn)
    yield pool
    await pool.close()


@pytest.fixture
def topic(kafka_servers: str, unique: str) -> str:
    name = f"test.events.{unique}"
    ensure_topics(kafka_servers, [TopicSpec(name, partitions=3)])
    return name


@pytest.fixture
async def store(pool: AsyncConnectionPool, topic: str) -> EventStore:
    store = EventStore("test", topic)
    async with pool.connection() as conn:
        await store.setup(conn)
    return store


async def append_credits(pool: AsyncConnectionPool, store: EventStore, n: int, accounts: int = 5) -> None:
    versions: dict[str, int] = {}
    async with pool.connection() as conn, conn.transaction():
        for i in range(n):
            account = f"acct-{i % accounts}"
            v = versions.get(account, 0)
            await store.append(conn, account, v, [credited(account, i + 1)])
            versions[account] = v + 1


def new_consumer(
    name: str, topic: str, pool: AsyncConnectionPool, kafka_servers: str, *, batch: bool = False
) -> ExactlyOnceConsumer:
    """A consumer of the credits projection: one event per handler call, or (``batch``) a batch per call."""
    kafka = make_consumer(kafka_servers, name, f"{name}-client", session_timeout_ms=10_000, heartbeat_interval_ms=1_000)
    return ExactlyOnceConsumer(name, [topic], pool, batched(apply_credits) if batch else apply_credit, kafka)


HANDLER_SHAPES = pytest.mark.parametrize("batch", [False, True], ids=["one_by_one", "batched"])


async def drain(consumer: ExactlyOnceConsumer, pool: AsyncConnectionPool, expected_applied: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        await consumer.poll_once()
        async with pool.connection() as conn:
            if sum(applied for _, applied in (await credits(conn)).values()) >= expected_applied:
                return
    raise AssertionError(f"consumer did not apply {expected_applied} events within {DEADLINE_S}s")


def expected_totals(n: int, accounts: int = 5) -> dict[str, tuple[int, int]]:
    totals: dict[str, tuple[int, int]] = {}
    for i in range(n):
        account = f"acct-{i % accounts}"
        total, count = totals.get(account, (0, 0))
        totals[account] = (total + i + 1, count + 1)
    return totals


def records_on_topic(kafka_servers: str, topic: str) -> int:
    consumer: KafkaConsumer = make_consumer(kafka_servers, None, "count")
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return sum(consumer.end_offsets(parts).values())
    finally:
        consumer.close()


async def test_relay_publishes_every_event_once_and_consumer_applies_it(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str
) -> None:
    await append_credits(pool, store, 40)
    relay = OutboxRelay("test", pool, make_producer(kafka_servers, "relay"), batch_size=25)
    assert await relay.publish_once() == 25
    assert await relay.publish_once() == 15
    assert await relay.publish_once() == 0
    assert records_on_topic(kafka_servers, topic) == 40
    consumer = new_consumer(f"g-{unique}", topic, pool, kafka_servers)
    await drain(consumer, pool, 40)
    async with pool.connection() as conn:
        assert await credits(conn) == expected_totals(40)


async def test_an_event_as_large_as_the_store_takes_travels_to_the_consumer(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str
) -> None:
    """The largest payload the event store accepts (a full round's settlement is up to 2.7 MB) goes through
    the relay's producer, the broker and a consumer, between two small events, in order."""
    big = credited("acct-big", 2)
    assert isinstance(big.payload, struct_pb2.Struct)
    big.payload.update({"note": ""})
    padding = MAX_PAYLOAD_BYTES - big.payload.ByteSize() - 16  # the nested lengths grow by a few bytes
    big.payload.update({"note": "x" * padding})
    assert MAX_PAYLOAD_BYTES - 32 < big.payload.ByteSize() <= MAX_PAYLOAD_BYTES
    async with pool.connection() as conn, conn.transaction():
        await store.append(conn, "acct-big", 0, [credited("acct-big", 1), big, credited("acct-big", 4)])
    relay = OutboxRelay("test", pool, make_producer(kafka_servers, "relay"), batch_size=10)
    assert await relay.publish_once() == 3
    consumer = new_consumer(f"g-{unique}", topic, pool, kafka_servers)
    await drain(consumer, pool, 3)
    async with pool.connection() as conn:
        assert await credits(conn) == {"acct-big": (7, 3)}


async def test_a_topic_under_the_systems_record_limit_stops_the_relay_with_the_fix_in_its_error(
    pool: AsyncConnectionPool, kafka_servers: str, unique: str
) -> None:
    """A topic made elsewhere with Kafka's default limit (1 MiB): the relay is refused a 2 MB event, says which
    record and what to set, and keeps it (nothing marked published) for when the topic is fixed."""
    small_topic = f"test.small.{unique}"
    ensure_topics(kafka_servers, [TopicSpec(small_topic, partitions=1, config={"max.message.bytes": "1048588"})])
    store = EventStore("test", small_topic)
    big = credited("acct-big", 2)
    assert isinstance(big.payload, struct_pb2.Struct)
    big.payload.update({"note": base64.b64encode(os.urandom(1_500_000)).decode()})  # 2 MB zstd cannot shrink
    async with pool.connection() as conn:
        await store.setup(conn)
        async with conn.transaction():
            await store.append(conn, "acct-big", 0, [big])
    relay = OutboxRelay("test", pool, make_producer(kafka_servers, "relay"), batch_size=10)
    with pytest.raises(MessageSizeTooLargeError, match=f"topic {small_topic}\\): set the topic's max.message.bytes"):
        await relay.publish_once()
    assert (await relay.pending())[0] == 1


@pytest.mark.parametrize("linger_s", [0.0, 3.0], ids=["eager", "lingering"])
async def test_a_relay_that_caught_up_lingers_and_publishes_a_trickle_in_one_batch(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, linger_s: float
) -> None:
    """Each batch costs a transaction, a fencing check, a flush to the broker and a fetch for every
    consumer: after a batch that was not full the relay waits ``linger_s`` for more to gather."""
    relay = OutboxRelay("test", pool, make_producer(kafka_servers, "relay"), idle_sleep_s=0.02, linger_s=linger_s)
    published: list[int] = []

    async def count(batch: list[PendingRecord]) -> None:
        published.append(len(batch))

    relay.after_publish = count
    stop = asyncio.Event()
    running = asyncio.create_task(relay.run(stop))
    try:
        for i in range(4):  # one event every 0.3 s: fifteen idle polls apart, well within the linger
            async with pool.connection() as conn, conn.transaction():
                await store.append(conn, f"trickle-{i}", 0, [credited(f"trickle-{i}", 1)])
            await asyncio.sleep(0.3)
        deadline = time.monotonic() + DEADLINE_S
        while sum(published) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await running
    if linger_s:
        assert published == [1, 3]  # the first event alone (the outbox was idle), the rest gathered
    else:
        assert len(published) >= 3  # one batch an event (two, if a poll came late)
    assert records_on_topic(kafka_servers, topic) == 4


@HANDLER_SHAPES
async def test_relay_killed_after_publish_before_marking_sent_consumer_still_applies_once(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str, batch: bool
) -> None:
    await append_credits(pool, store, 30)
    doomed = OutboxRelay("test", pool, make_producer(kafka_servers, "doomed"))

    async def die(batch: list[PendingRecord]) -> None:
        raise Crash("killed after Kafka acknowledged, before marking published")

    doomed.after_publish = die
    with pytest.raises(Crash):
        await doomed.publish_once()
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        assert await cur.fetchone() == (30,)

    restarted = OutboxRelay("test", pool, make_producer(kafka_servers, "restarted"))
    assert await restarted.publish_once() == 30
    assert records_on_topic(kafka_servers, topic) == 60  # every event is on the topic twice

    consumer = new_consumer(f"g-{unique}", topic, pool, kafka_servers, batch=batch)
    await drain(consumer, pool, 30)
    for _ in range(5):  # let it read the duplicates too
        await consumer.poll_once()
    async with pool.connection() as conn:
        assert await credits(conn) == expected_totals(30)
        cur = await conn.execute("SELECT count(*) FROM processed_events")
        assert await cur.fetchone() == (30,)


@HANDLER_SHAPES
async def test_consumer_killed_mid_stream_resumes_without_loss_or_double_effect(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str, batch: bool
) -> None:
    await append_credits(pool, store, 60)
    await OutboxRelay("test", pool, make_producer(kafka_servers, "relay")).publish_once()
    group = f"g-{unique}"
    first = new_consumer(group, topic, pool, kafka_servers, batch=batch)
    seen = 0

    async def die_after_some(record: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == 17:  # effects of record 17 committed, Kafka offset not yet committed
            raise Crash("killed between the database commit and the Kafka commit")

    first.after_commit = die_after_some
    with pytest.raises(Crash):
        for _ in range(100):
            await first.poll_once()
    first._kafka.close(autocommit=False)  # a dead process commits nothing more

    second = new_consumer(group, topic, pool, kafka_servers, batch=batch)
    await drain(second, pool, 60)
    for _ in range(3):
        await second.poll_once()
    async with pool.connection() as conn:
        assert await credits(conn) == expected_totals(60)


async def test_two_consumers_in_one_group_share_partitions_and_apply_each_event_once(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str
) -> None:
    await append_credits(pool, store, 90, accounts=9)
    await OutboxRelay("test", pool, make_producer(kafka_servers, "relay")).publish_once()
    group = f"g-{unique}"
    a, b = new_consumer(group, topic, pool, kafka_servers), new_consumer(group, topic, pool, kafka_servers)
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        await asyncio.gather(a.poll_once(), b.poll_once())
        async with pool.connection() as conn:
            if sum(applied for _, applied in (await credits(conn)).values()) >= 90:
                break
    for _ in range(3):
        await asyncio.gather(a.poll_once(), b.poll_once())
    async with pool.connection() as conn:
        assert await credits(conn) == expected_totals(90, accounts=9)
    a._kafka.close()
    b._kafka.close()


async def test_a_selective_consumer_skips_other_event_types_without_tracking_them(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str
) -> None:
    async with pool.connection() as conn, conn.transaction():
        for i in range(30):
            event = credited(f"acct-{i % 3}", i + 1)
            if i % 3:  # two in three are of a type the handler does not act on
                event = NewEvent("test.noise", event.payload)
            await store.append(conn, f"s-{i}", 0, [event])
    await OutboxRelay("test", pool, make_producer(kafka_servers, "relay")).publish_once()
    kafka = make_consumer(kafka_servers, f"g-{unique}", "selective")
    consumer = ExactlyOnceConsumer(f"g-{unique}", [topic], pool, handling({"test.credited"}, apply_credit), kafka)
    await drain(consumer, pool, 10)
    for _ in range(3):
        await consumer.poll_once()
    async with pool.connection() as conn:
        assert await credits(conn) == {"acct-0": (sum(i + 1 for i in range(0, 30, 3)), 10)}
        cur = await conn.execute("SELECT count(*) FROM processed_events")
        assert await cur.fetchone() == (10,)  # the 20 skipped events left no tracking row
    kafka.close()


async def test_a_leased_consumer_killed_mid_stream_is_replaced_within_the_lease_and_applies_once(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str, redis_url: str
) -> None:
    """No group coordinator to wait for: the successor assigns itself the partitions once the leases expire."""
    async with pool.connection() as conn:
        await PgFence.setup(conn)
    name = f"g-{unique}"
    redis = Redis.from_url(redis_url)
    try:

        def leased(owner: str) -> ExactlyOnceConsumer:
            kafka = make_consumer(kafka_servers, name, f"{name}-{owner}")
            leases = PartitionLeases(redis, f"consumer:{name}", owner, 1_500, pool)
            return ExactlyOnceConsumer(name, [topic], pool, apply_credit, kafka, leases=leases)

        first = leased("first")
        assert await first.poll_once() == 0  # the only member: it takes every partition
        await append_credits(pool, store, 60)
        await OutboxRelay("test", pool, make_producer(kafka_servers, "relay")).publish_once()
        seen = 0

        async def die_after_some(record: Any) -> None:
            nonlocal seen
            seen += 1
            if seen == 17:
                raise Crash("killed between the database commit and the Kafka commit")

        first.after_commit = die_after_some
        with pytest.raises(Crash):
            for _ in range(100):
                await first.poll_once()
        first._kafka.close(autocommit=False)  # a dead process commits nothing more and never renews

        killed_at = time.monotonic()
        async with pool.connection() as conn:
            applied_before = sum(applied for _, applied in (await credits(conn)).values())
        assert applied_before >= 17
        standby = leased("second")
        await drain(standby, pool, 60)
        took_over_in = time.monotonic() - killed_at
        for _ in range(3):
            await standby.poll_once()
        async with pool.connection() as conn:
            assert await credits(conn) == expected_totals(60)
        print(f"successor applied the rest {took_over_in:.1f}s after the kill (lease ttl 1.5s)")
        assert took_over_in < DEADLINE_S
        standby._kafka.close()
    finally:
        await redis.aclose()


async def test_a_relay_polling_an_empty_outbox_locks_nothing_and_writes_nothing(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str, redis_url: str
) -> None:
    """The idle poll reads; only a poll with events to publish checks the fences under their row locks.

    A lock taken with FOR SHARE is written into the row (its ``xmax``), and the poll's commit then
    waits for the disk: the relays' idle polls were the database's most frequent flushed commits.
    """
    async with pool.connection() as conn:
        await PgFence.setup(conn)
    redis = Redis.from_url(redis_url)

    async def fence_lockers() -> list[int]:
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT xmax::text::bigint FROM lease_fences ORDER BY name")
            return [int(row[0]) for row in await cur.fetchall()]

    try:
        leases = PartitionLeases(redis, f"relay:{unique}", "only", 10_000, pool)
        relay = OutboxRelay("test", pool, make_producer(kafka_servers, "relay-idle"), leases=leases, topics=[topic])
        await relay.refresh(force=True)
        assert len(leases.held) == 3
        before = await fence_lockers()  # the acquires' own updates
        for _ in range(3):
            assert await relay.publish_once() == 0
        assert await fence_lockers() == before
        await append_credits(pool, store, 2)
        assert await relay.publish_once() == 2
        assert await fence_lockers() != before  # with events to publish, the tokens are checked under their locks
        await leases.leave()
    finally:
        await redis.aclose()


async def test_a_leased_consumer_goes_on_applying_while_redis_is_unreachable(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str, redis_url: str
) -> None:
    """The leases only divide the work (the database keeps effects exactly once, each transaction checks
    its partitions' fences): Redis gone, the consumer goes on applying the partitions it held."""
    async with pool.connection() as conn:
        await PgFence.setup(conn)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    redis = Redis.from_url(redis_url)
    gone = Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.2, socket_timeout=0.2)
    try:
        name = f"g-{unique}"
        leases = PartitionLeases(redis, f"consumer:{name}", "only", 3_000, pool)
        consumer = ExactlyOnceConsumer(
            name, [topic], pool, apply_credit, make_consumer(kafka_servers, name, f"{name}-c"), leases=leases
        )
        assert await consumer.poll_once() == 0  # takes every partition
        assert len(leases.held) == 3
        leases._redis = gone  # Redis is unreachable from here on
        consumer._shared_at = float("-inf")  # and the next poll asks it
        await append_credits(pool, store, 30)
        await OutboxRelay("test", pool, make_producer(kafka_servers, "relay")).publish_once()
        await drain(consumer, pool, 30)
        async with pool.connection() as conn:
            assert await credits(conn) == expected_totals(30)
        consumer._kafka.close()
    finally:
        await redis.aclose()
        await gone.aclose()


async def test_a_record_whose_transaction_fails_is_applied_before_any_record_after_it(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str
) -> None:
    """One event per transaction (as the wallet applies settlements): the sixth fails while the database is
    away (its batch and its one-by-one retry); it is applied on a later poll, and none after it is applied
    first (they would move the stored position past it and it would be skipped for good)."""
    await append_credits(pool, store, 30, accounts=1)  # one stream: one partition, in order
    await OutboxRelay("test", pool, make_producer(kafka_servers, "relay")).publish_once()
    applied: list[int] = []
    failures = 0

    async def flaky(conn: Any, envelope: Any) -> None:
        nonlocal failures
        if len(applied) == 5 and failures < 2:
            failures += 1
            raise psycopg.OperationalError("the database went away")
        await apply_credit(conn, envelope)
        applied.append(len(applied))

    kafka = make_consumer(kafka_servers, f"g-{unique}", "flaky")
    consumer = ExactlyOnceConsumer(f"g-{unique}", [topic], pool, flaky, kafka, batch_size=1)
    await drain(consumer, pool, 30)
    for _ in range(3):
        await consumer.poll_once()
    async with pool.connection() as conn:
        assert failures == 2
        assert await credits(conn) == expected_totals(30, accounts=1)  # every credit once, the failed one too
    kafka.close()


class WedgedProducer:
    """A Kafka producer that takes records and never gets them acknowledged, as one kafka-python producer
    stayed after a broker restart (every flush timing out) while a new client got through at once."""

    def __init__(self) -> None:
        self.closed = False

    def send(self, topic: str, key: bytes, value: bytes, partition: int | None = None, headers: object = None) -> None:
        return None

    def flush(self, timeout: float | None = None) -> None:
        raise KafkaTimeoutError("Timeout waiting for future")

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


async def test_a_relay_whose_producer_stays_wedged_replaces_it_and_publishes(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str
) -> None:
    await append_credits(pool, store, 20)
    wedged = WedgedProducer()
    relay = OutboxRelay("test", pool, wedged, new_producer=lambda: make_producer(kafka_servers, "relay"))
    for _ in range(RENEW_PRODUCER_AFTER):
        with pytest.raises(KafkaTimeoutError):
            await relay.publish_once()
    assert wedged.closed
    assert await relay.publish_once() == 20  # the new producer
    assert records_on_topic(kafka_servers, topic) == 20
    await drain(new_consumer(f"g-{unique}", topic, pool, kafka_servers), pool, 20)
    async with pool.connection() as conn:
        assert await credits(conn) == expected_totals(20)


async def test_a_poll_of_several_partitions_is_applied_in_one_transaction(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str
) -> None:
    """Events of five streams on three partitions, all published before the first poll: the records a
    poll brings from several partitions share one transaction, and each is applied once."""
    await append_credits(pool, store, 30)
    await OutboxRelay("test", pool, make_producer(kafka_servers, "relay")).publish_once()
    seen: list[tuple[int, int]] = []  # (transaction id, partition)

    async def traced(conn: Any, batch: Any) -> None:
        cur = await conn.execute("SELECT txid_current()")
        txid = (await cur.fetchone())[0]
        seen.extend((txid, tracked.partition) for tracked in batch)
        await apply_credits(conn, batch)

    kafka = make_consumer(kafka_servers, f"g-{unique}", "together")
    consumer = ExactlyOnceConsumer(f"g-{unique}", [topic], pool, batched(traced), kafka)
    await drain(consumer, pool, 30)
    kafka.close()
    partitions_by_txid: dict[int, set[int]] = {}
    for txid, partition in seen:
        partitions_by_txid.setdefault(txid, set()).add(partition)
    assert len(seen) == 30
    assert max(len(p) for p in partitions_by_txid.values()) > 1, partitions_by_txid
    async with pool.connection() as conn:
        assert await credits(conn) == expected_totals(30)


async def test_a_failing_record_of_a_poll_of_several_partitions_holds_back_its_partition_only(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str
) -> None:
    """The credit of 12 (acct-1's third) fails in the poll's shared transaction, in its partition's own
    batch and alone: the other partitions' records and acct-1's two before it land meanwhile; it and its
    partition's later records land on a later poll, each once."""
    await append_credits(pool, store, 30)
    await OutboxRelay("test", pool, make_producer(kafka_servers, "relay")).publish_once()
    failures = 0

    async def flaky(conn: Any, envelope: Any) -> None:
        nonlocal failures
        payload = struct_pb2.Struct()
        envelope.payload.Unpack(payload)
        if payload.fields["amount"].number_value == 12 and failures < 3:
            failures += 1
            raise psycopg.OperationalError("the database went away")
        await apply_credit(conn, envelope)

    kafka = make_consumer(kafka_servers, f"g-{unique}", "flaky")
    consumer = ExactlyOnceConsumer(f"g-{unique}", [topic], pool, flaky, kafka)
    deadline = time.monotonic() + DEADLINE_S
    while failures < 3 and time.monotonic() < deadline:
        await consumer.poll_once()
    async with pool.connection() as conn:
        meanwhile = await credits(conn)
    final = expected_totals(30)
    assert failures == 3
    assert meanwhile["acct-1"] == (2 + 7, 2)  # up to the failed one, not past it
    assert any(meanwhile.get(account) == totals for account, totals in final.items()), meanwhile
    await drain(consumer, pool, 30)
    kafka.close()
    async with pool.connection() as conn:
        assert await credits(conn) == final  # every credit once, the failed one too


@pytest.mark.parametrize("parallel", [1, 3])
async def test_partitions_applied_side_by_side_apply_each_event_once(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str, parallel: int
) -> None:
    """One record a transaction (as the wallet's settlements): with ``parallel_partitions`` the records
    of a poll's partitions are inside their handlers at the same time, without it one at a time; each
    is applied once and each partition's records in order."""
    await append_credits(pool, store, 30)
    await OutboxRelay("test", pool, make_producer(kafka_servers, "relay")).publish_once()
    inside = most = 0
    order: dict[str, list[int]] = {}

    async def slow(conn: Any, envelope: Any) -> None:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        try:
            await asyncio.sleep(0.05)  # time for a record of another partition to start meanwhile
            await apply_credit(conn, envelope)
            order.setdefault(envelope.stream_id, []).append(envelope.stream_version)
        finally:
            inside -= 1

    kafka = make_consumer(kafka_servers, f"g-{unique}", "side-by-side")
    consumer = ExactlyOnceConsumer(
        f"g-{unique}", [topic], pool, slow, kafka, batch_size=1, parallel_partitions=parallel
    )
    await drain(consumer, pool, 30)
    kafka.close()
    assert most == parallel if parallel == 1 else most > 1
    assert all(versions == sorted(versions) for versions in order.values()), order
    async with pool.connection() as conn:
        assert await credits(conn) == expected_totals(30)


@pytest.mark.parametrize("parallel", [1, 3])
async def test_a_poll_that_fails_outside_the_handlers_is_read_again(
    pool: AsyncConnectionPool, store: EventStore, topic: str, kafka_servers: str, unique: str, parallel: int
) -> None:
    """The database is unreachable when the consumer first looks up a partition's stored position: the
    poll fails, Kafka has moved past its records, and the consumer reads them again (each applied once,
    none lost), partition after partition or side by side (the others cancelled)."""
    await append_credits(pool, store, 30)
    await OutboxRelay("test", pool, make_producer(kafka_servers, "relay")).publish_once()
    kafka = make_consumer(kafka_servers, f"g-{unique}", "reread")
    consumer = ExactlyOnceConsumer(
        f"g-{unique}", [topic], pool, apply_credit, kafka, batch_size=1, parallel_partitions=parallel
    )
    stored_position = consumer._stored_position
    failed = 0

    async def unreachable_once(tp: TopicPartition) -> int:
        nonlocal failed
        if not failed:
            failed += 1
            raise psycopg.OperationalError("the database went away")
        return await stored_position(tp)

    consumer._stored_position = unreachable_once  # type: ignore[method-assign]
    deadline = time.monotonic() + DEADLINE_S
    while not failed and time.monotonic() < deadline:
        with contextlib.suppress(psycopg.OperationalError, ExceptionGroup):
            await consumer.poll_once()
    assert failed == 1
    await drain(consumer, pool, 30)
    kafka.close()
    async with pool.connection() as conn:
        assert await credits(conn) == expected_totals(30)
