"""The outbox relay: publishes committed events to Kafka, at least once, in store order.

One relay per service publishes at a time (a Redis lease), so a stream's events
reach its partition in version order. The lease's fencing token comes from the
service's database (``backbone.lease.PgFence``) and every batch checks it in its
own transaction: a relay that lost its lease without noticing (paused, or Redis
lost the lease) cannot publish next to the new leader. A relay that dies after Kafka
acknowledged a batch but before marking it published sends that batch again on
restart; consumers recognise the duplicates by event id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kafka import KafkaProducer
from kafka.errors import MessageSizeTooLargeError
from psycopg_pool import AsyncConnectionPool

from backbone import metrics
from backbone.db import framed
from backbone.eventstore import with_store_position
from backbone.kafka import MAX_RECORD_BYTES
from backbone.lease import RedisLease, StaleOwner

log = logging.getLogger(__name__)

MAX_BATCH_EVENTS = 1_000
MAX_LINGER_S = 5.0
"""Bound on the wait after a batch that was not full (every wait is bounded)."""
PENDING_SAMPLE_S = 1.0
"""How often the relay counts its backlog for the metrics (a scan of the unpublished rows)."""
RENEW_PRODUCER_AFTER = 2
"""Sends that failed in a row before the relay replaces its Kafka producer with a new one. A
kafka-python producer can stay wedged after the broker restarts (every flush timing out for
minutes while a new client gets through at once: niuniu-chaos seed 7, a table's relay after a
``kafka_restart``)."""

# The relay's reads of the outbox go through its index of unpublished rows, and reach each event by its
# position, whatever the tables' statistics (``backbone.db``: a plan cached on new tables stays): as
# ``EXISTS (... WHERE published_at IS NULL)`` the probe read the whole outbox on every poll.
FIRST_UNPUBLISHED = "SELECT position FROM outbox WHERE published_at IS NULL ORDER BY position LIMIT 1"
"""The relay's probe: a row while anything is unpublished."""
PENDING = (
    "SELECT count(*), coalesce(extract(epoch FROM now() - min(e.occurred_at)), 0) FROM outbox o"
    " CROSS JOIN LATERAL (SELECT occurred_at FROM events WHERE position = o.position OFFSET 0) e"
    " WHERE o.published_at IS NULL"
)
"""(unpublished events, age in seconds of the oldest one)."""


@dataclass(frozen=True, slots=True)
class PendingRecord:
    position: int
    topic: str
    key: str
    value: bytes


class OutboxRelay:
    def __init__(
        self,
        service: str,
        pool: AsyncConnectionPool,
        producer: KafkaProducer,
        *,
        lease: RedisLease | None = None,
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
        self.service = service
        self._pool = pool
        self._producer = producer
        self._lease = lease
        self._batch_size = batch_size
        self._idle_sleep_s = idle_sleep_s
        self._linger_s = linger_s
        self._send_timeout_s = send_timeout_s
        self._new_producer = new_producer
        self._failed_sends = 0
        # Test seam: called after Kafka acknowledged a batch, before it is marked published.
        self.after_publish: Callable[[list[PendingRecord]], Awaitable[None]] | None = None

    async def publish_once(self) -> int:
        """Publish one batch of unpublished events; returns how many.

        An empty outbox is seen by a plain read first, before the fencing token is checked: the
        check locks the token's row (FOR SHARE writes the row), so a poll that checked it ended in
        a commit that waited for the disk. The relays poll every ``idle_sleep_s`` when idle and
        again after every batch, so that was the database's most frequent flushed commit, and the
        bets' commits queued behind it. With work to do the poll is as before: the token checked
        under its lock, then the rows taken in order.

        Round trips (``framed``): one for an idle poll (the probe, outside a transaction), four with
        work (the probe; the BEGIN with the check; the rows; the marks with the COMMIT).
        """
        async with self._pool.connection() as conn, framed(conn) as tx:
            probe = await conn.execute(FIRST_UNPUBLISHED)  # autocommit
            if await probe.fetchone() is None:
                return 0
            if self._lease is not None and self._lease.fence is not None and self._lease.token is None:
                return 0
            async with conn.pipeline():
                await tx.begin()  # travels with the fencing check
                if self._lease is not None and self._lease.fence is not None:
                    assert self._lease.token is not None
                    await self._lease.fence.check(conn, self._lease.token)  # StaleOwner: another relay leads now
                cur = await conn.execute(
                    "SELECT o.position, o.topic, o.record_key, e.envelope FROM outbox o"
                    " JOIN events e USING (position)"
                    " WHERE o.published_at IS NULL ORDER BY o.position LIMIT %s FOR UPDATE OF o SKIP LOCKED",
                    (self._batch_size,),
                )
            batch = [
                PendingRecord(int(r[0]), r[1], r[2], with_store_position(bytes(r[3]), int(r[0])))
                for r in await cur.fetchall()
            ]
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
            futures = [self._producer.send(r.topic, key=r.key.encode(), value=r.value) for r in batch]
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
        """Publish until ``stop`` is set; only while holding the lease, when one is given.

        After an empty poll it waits ``idle_sleep_s``; after a batch that was not full (it caught
        up), ``linger_s``, so that a steady trickle goes out in batches rather than one by one; after
        a full batch it polls again at once."""
        sampled = 0.0
        while not stop.is_set():
            try:
                if not await self._is_leader():
                    await _sleep_or_stop(stop, 1.0)
                    continue
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
            except StaleOwner as error:
                log.warning("outbox relay superseded; standing by", extra={"error": str(error)})
                if self._lease is not None:
                    self._lease.token = None
                await _sleep_or_stop(stop, 1.0)
            except Exception:
                log.exception("outbox relay failed; retrying")
                await _sleep_or_stop(stop, 1.0)
        if self._lease is not None:
            await self._lease.release()
            metrics.RELAY_LEADER.labels(self.service).set(0)

    async def _is_leader(self) -> bool:
        if self._lease is None:
            return True
        held = await self._lease.renew() or await self._lease.acquire() is not None
        metrics.RELAY_LEADER.labels(self.service).set(1 if held else 0)
        return held


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
