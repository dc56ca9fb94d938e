"""The outbox relay: publishes committed events to Kafka, at least once, in store order.

The outbox is divided by partition: a row's ``key_hash`` (of its record key, the
stream id) gives its partition on its topic as Kafka's default partitioner would
(``backbone.keyhash.key_hash``), and the relays of a service share the
partitions out among themselves (``backbone.lease.PartitionLeases``), each
publishing only its own partitions' rows, in position order, to those partitions.
One relay at a time publishes a partition, so a stream's events reach it in
version order. Each partition's fencing token comes from the service's database
and every batch checks the tokens of its relay's partitions in its own
transaction: a relay that lost a partition without noticing (paused, or Redis
lost the lease) cannot publish it next to its new owner. A relay that dies after
Kafka acknowledged a batch but before marking it published has that batch sent
again by the partitions' next owner; consumers recognise the duplicates by event id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import psycopg
from kafka import KafkaProducer
from kafka.errors import MessageSizeTooLargeError
from psycopg_pool import AsyncConnectionPool

from backbone import metrics
from backbone.db import framed
from backbone.eventreads import last_position
from backbone.eventstore import with_store_position
from backbone.kafka import MAX_RECORD_BYTES
from backbone.keyhash import key_hash
from backbone.lease import Part, PartitionLeases, StalePartitions
from backbone.tracing import TRACEPARENT

log = logging.getLogger(__name__)

MAX_BATCH_EVENTS = 1_000
MAX_LINGER_S = 5.0
"""Bound on the wait after a batch that was not full (every wait is bounded)."""
PENDING_SAMPLE_S = 1.0
MAX_HASHED_PER_REFRESH = 10_000
"""Bound on the unpublished rows without a ``key_hash`` (written before the column, or by a replica still
on the code before it) that one refresh of the partitions hashes."""
"""How often the relay counts its backlog for the metrics (a scan of the unpublished rows)."""
RENEW_PRODUCER_AFTER = 2
"""Sends that failed in a row before the relay replaces its Kafka producer with a new one. A
kafka-python producer can stay wedged after the broker restarts (every flush timing out for
minutes while a new client gets through at once: niuniu-chaos seed 7, a table's relay after a
``kafka_restart``)."""

# The relay's reads of the outbox go through its index of unpublished rows, and reach each event by its
# position, whatever the tables' statistics (``backbone.db``: a plan cached on new tables stays): as
# ``EXISTS (... WHERE published_at IS NULL)`` the probe read the whole outbox on every poll.
FIRST_UNPUBLISHED = "SELECT position FROM outbox WHERE published_at IS NULL{owned} ORDER BY position LIMIT 1"
"""The relay's probe: a row while anything (of its partitions, ``OWNED``) is unpublished."""
OWNED = (
    " AND EXISTS (SELECT FROM unnest(%(topics)s::text[], %(counts)s::int[], %(parts)s::int[]) AS m (topic, n, part)"
    " WHERE m.topic = outbox.topic AND mod(outbox.key_hash, m.n) = m.part)"
)
"""Rows of the relay's partitions: (topic, partition, the topic's partition count) as three arrays."""
UNPUBLISHED = (
    "SELECT outbox.position, outbox.topic, outbox.record_key, outbox.key_hash, e.envelope, outbox.trace_context"
    " FROM outbox"
    " JOIN events e USING (position) WHERE outbox.published_at IS NULL{owned}"
    " ORDER BY outbox.position LIMIT %(limit)s FOR UPDATE OF outbox SKIP LOCKED"
)
UNHASHED = "SELECT position, record_key FROM outbox WHERE published_at IS NULL AND key_hash IS NULL LIMIT %s"
PENDING = (
    "SELECT count(*), coalesce(extract(epoch FROM now() - min(e.occurred_at)), 0) FROM outbox o"
    " CROSS JOIN LATERAL (SELECT occurred_at FROM events WHERE position = o.position OFFSET 0) e"
    " WHERE o.published_at IS NULL"
)
"""(unpublished events, age in seconds of the oldest one)."""


async def published_below(conn: psycopg.AsyncConnection) -> int:
    """Every event with a smaller position is in Kafka (acknowledged to the relays): the first unpublished
    position of the outbox, or the store's last position + 1 when everything is published."""
    cur = await conn.execute(FIRST_UNPUBLISHED.format(owned=""))
    row = await cur.fetchone()
    return int(row[0]) if row else await last_position(conn) + 1


@dataclass(frozen=True, slots=True)
class PendingRecord:
    position: int
    topic: str
    key: str
    value: bytes
    partition: int | None = None
    """The record's partition when the relay owns partitions (else the producer's partitioner picks the same)."""
    traceparent: str | None = None
    """The trace of the command that appended the event (backbone/tracing.py), sent as a record header."""

    def headers(self) -> list[tuple[str, bytes]] | None:
        return [(TRACEPARENT, self.traceparent.encode())] if self.traceparent else None


class OutboxRelay:
    """Publishes the outbox, or with ``leases`` its share of the partitions of ``topics`` (every topic its
    service writes: a row of another topic would wait unpublished)."""

    def __init__(
        self,
        service: str,
        pool: AsyncConnectionPool,
        producer: KafkaProducer,
        *,
        leases: PartitionLeases | None = None,
        topics: Sequence[str] = (),
        batch_size: int = 500,
        idle_sleep_s: float = 0.05,
        linger_s: float = 0.0,
        send_timeout_s: float = 15.0,
        new_producer: Callable[[], KafkaProducer] | None = None,
    ) -> None:
        if not 0 < batch_size <= MAX_BATCH_EVENTS:
            raise ValueError(f"batch_size must be 1..{MAX_BATCH_EVENTS}")
        if not 0 <= linger_s <= MAX_LINGER_S:
            raise ValueError(f"linger_s must be 0..{MAX_LINGER_S}")
        if leases is not None and not topics:
            raise ValueError("a relay that owns partitions needs its topics")
        self.service = service
        self._pool = pool
        self._producer = producer
        self._leases = leases
        self._topics = list(topics)
        self._counts: dict[str, int] = {}
        self._refreshed_at = float("-inf")
        self._batch_size = batch_size
        self._idle_sleep_s = idle_sleep_s
        self._linger_s = linger_s
        self._send_timeout_s = send_timeout_s
        self._new_producer = new_producer
        self._failed_sends = 0
        # Test seam: called after Kafka acknowledged a batch, before it is marked published.
        self.after_publish: Callable[[list[PendingRecord]], Awaitable[None]] | None = None

    async def publish_once(self) -> int:
        """Publish one batch of unpublished events (of this relay's partitions); returns how many.

        An empty outbox is seen by a plain read first, before the fencing tokens are checked: the
        check locks the tokens' rows (FOR SHARE writes the row), so a poll that checked them ended in
        a commit that waited for the disk. The relays poll every ``idle_sleep_s`` when idle and
        again after every batch, so that was the database's most frequent flushed commit, and the
        bets' commits queued behind it. With work to do the poll is as before: the tokens checked
        under their locks, then the rows taken in order.

        Round trips (``framed``): one for an idle poll (the probe, outside a transaction), four with
        work (the probe; the BEGIN with the check; the rows; the marks with the COMMIT).
        """
        owned = self._owned()
        if owned is not None and not owned:
            return 0
        where, params = ("", {}) if owned is None else (OWNED, self._owned_params(owned))
        async with self._pool.connection() as conn, framed(conn) as tx:
            probe = await conn.execute(FIRST_UNPUBLISHED.format(owned=where), params)  # autocommit
            if await probe.fetchone() is None:
                return 0
            async with conn.pipeline():
                await tx.begin()  # travels with the fencing check
                if self._leases is not None and owned:
                    await self._leases.check(conn, owned)  # StalePartitions: another relay owns some now
                cur = await conn.execute(UNPUBLISHED.format(owned=where), {**params, "limit": self._batch_size})
            batch = [self._record(row, owned is not None) for row in await cur.fetchall()]
            if not batch:
                return 0
            await self._send(batch)
            if self.after_publish is not None:
                await self.after_publish(batch)
            async with conn.pipeline():
                await conn.execute(
                    "UPDATE outbox SET published_at = now() WHERE position = ANY(%s)", ([r.position for r in batch],)
                )
                await tx.commit()
        for record in batch:
            metrics.OUTBOX_PUBLISHED.labels(self.service, record.topic).inc()
        return len(batch)

    def _owned(self) -> frozenset[Part] | None:
        """The partitions this relay publishes (of the topics whose partition count it knows); None: all."""
        if self._leases is None:
            return None
        return frozenset(part for part in self._leases.held if part[0] in self._counts)

    def _owned_params(self, owned: frozenset[Part]) -> dict[str, object]:
        ordered = sorted(owned)
        return {
            "topics": [topic for topic, _ in ordered],
            "counts": [self._counts[topic] for topic, _ in ordered],
            "parts": [partition for _, partition in ordered],
        }

    def _record(self, row: tuple[int, str, str, int | None, bytes, str | None], partitioned: bool) -> PendingRecord:
        position, topic, key, hashed, envelope, traceparent = row
        partition = None
        if partitioned:
            assert hashed is not None  # the owned rows are those with a hash
            partition = hashed % self._counts[topic]
        value = with_store_position(bytes(envelope), int(position))
        return PendingRecord(int(position), topic, key, value, partition, traceparent)

    async def _send(self, batch: list[PendingRecord]) -> None:
        try:
            await asyncio.to_thread(self._send_all, batch)
        except Exception:
            self._failed_sends += 1
            if self._failed_sends >= RENEW_PRODUCER_AFTER and self._new_producer is not None:
                await asyncio.to_thread(self._renew_producer)
            raise
        self._failed_sends = 0

    def _renew_producer(self) -> None:
        """A new producer for the next try; the old one is closed without waiting for what it holds.

        Records it may still deliver are duplicates of the batch sent again, which consumers
        recognise by event id (as after a relay's restart)."""
        assert self._new_producer is not None
        old, self._producer = self._producer, self._new_producer()
        self._failed_sends = 0
        log.warning("outbox relay: Kafka producer replaced after failed sends", extra={"service": self.service})
        with contextlib.suppress(Exception):
            old.close(timeout=0)

    def _send_all(self, batch: list[PendingRecord]) -> None:
        try:
            futures = [
                self._producer.send(
                    r.topic, key=r.key.encode(), value=r.value, partition=r.partition, headers=r.headers()
                )
                for r in batch
            ]
            self._producer.flush(timeout=self._send_timeout_s)
            for future in futures:
                future.get(timeout=self._send_timeout_s)  # raises if the broker refused a record
        except MessageSizeTooLargeError as error:
            # The store takes no event the producer refuses (MAX_PAYLOAD_BYTES): this is a topic or broker
            # whose limit is under the system's, and the relay stops here until it is raised.
            largest = max(batch, key=lambda r: len(r.value))
            raise MessageSizeTooLargeError(
                f"{error}; the batch's largest record is {len(largest.value)} bytes (position {largest.position},"
                f" topic {largest.topic}): set the topic's max.message.bytes to {MAX_RECORD_BYTES}"
            ) from error

    async def pending(self) -> tuple[int, float]:
        """(unpublished events, age in seconds of the oldest one)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(PENDING)
            row = await cur.fetchone()
        assert row is not None
        return int(row[0]), float(row[1])

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until ``stop`` is set; with leases, only the partitions held.

        After an empty poll it waits ``idle_sleep_s``; after a batch that was not full (it caught
        up), ``linger_s``, so that a steady trickle goes out in batches rather than one by one; after
        a full batch it polls again at once."""
        sampled = 0.0
        while not stop.is_set():
            try:
                await self.refresh()
                published = await self.publish_once()
                if time.monotonic() - sampled >= PENDING_SAMPLE_S:
                    count, age = await self.pending()
                    metrics.OUTBOX_PENDING.labels(self.service).set(count)
                    metrics.OUTBOX_LAG_SECONDS.labels(self.service).set(age)
                    sampled = time.monotonic()
                if published == 0:
                    await _sleep_or_stop(stop, self._idle_sleep_s)
                elif published < self._batch_size:
                    await _sleep_or_stop(stop, self._linger_s)
            except StalePartitions as error:
                log.warning("outbox relay superseded on some partitions", extra={"error": str(error)})
                assert self._leases is not None
                self._leases.lose(error.parts)
            except Exception:
                log.exception("outbox relay failed; retrying")
                await _sleep_or_stop(stop, 1.0)
        if self._leases is not None:
            with contextlib.suppress(Exception):
                await self._leases.leave()
            metrics.RELAY_LEADER.labels(self.service).set(0)

    async def refresh(self, *, force: bool = False) -> None:
        """With leases, every third of their time to live (or ``force``): the topics' partition counts,
        the hash of any unpublished row without one, and the relay's share of the partitions.

        When Redis cannot be reached the relay goes on publishing what it held: its writes are
        fenced in PostgreSQL, and its leases run out in Redis for its successors."""
        if self._leases is None or (not force and time.monotonic() - self._refreshed_at < self._leases.ttl_ms / 3000):
            return
        self._refreshed_at = time.monotonic()
        self._counts = await asyncio.to_thread(self._partition_counts)
        await self._hash_unhashed()
        parts = [(topic, p) for topic, count in self._counts.items() for p in range(count)]
        try:
            held = await self._leases.refresh(parts)
        except Exception as error:
            log.warning("outbox relay could not refresh its partitions", extra={"error": repr(error)})
            held = self._leases.held
        metrics.RELAY_LEADER.labels(self.service).set(1 if held else 0)

    def _partition_counts(self) -> dict[str, int]:
        """Each topic's partition count, from the producer's metadata (topics not known yet are left out)."""
        counts = {}
        for topic in self._topics:
            partitions = self._producer.partitions_for(topic)
            if partitions:
                counts[topic] = len(partitions)
        return counts

    async def _hash_unhashed(self) -> None:
        """Give the unpublished rows without a ``key_hash`` theirs, so their partition's relay sees them."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(UNHASHED, (MAX_HASHED_PER_REFRESH,))
            rows = await cur.fetchall()
            if rows:
                await conn.execute(
                    "UPDATE outbox SET key_hash = h.hash FROM unnest(%s::bigint[], %s::int[]) AS h (position, hash)"
                    " WHERE outbox.position = h.position",
                    ([int(r[0]) for r in rows], [key_hash(r[1]) for r in rows]),
                )


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
