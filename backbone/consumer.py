"""Consumers with exactly-once effects on top of at-least-once delivery.

For every record the handler's effects, the event id and the partition position
are written in ONE PostgreSQL transaction. A record whose offset is below the
stored position, or whose event id was already applied (the relay may publish an
event twice), changes nothing. Kafka's committed offsets are only a hint for
where to resume and for lag dashboards: they are committed after the database,
so they can lag behind it, never run ahead of it. That makes the consumer safe
across crashes, restarts and group rebalances.

Given ``leases`` (``backbone.lease.PartitionLeases``) the replicas of a consumer divide
its partitions among themselves (no Kafka group membership), each starting a partition
from the position stored in PostgreSQL (or Kafka's hint, when further). A stopped owner's
partitions move at the others' next refresh, a dead one's within the lease's time to live;
the others never pause (docs/decisions/0011-partition-ownership.md). Every transaction
checks its partitions' fencing tokens: a deposed owner commits nothing for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
from niuniu.v1 import events_pb2
from psycopg_pool import AsyncConnectionPool

from backbone import logs, metrics, tracing
from backbone.db import framed, run_ddl
from backbone.handlers import TRACKING_SCHEMA, ApplyMany, BatchHandler, Handler, SelectiveHandler, Tracked
from backbone.lease import PartitionLeases, StalePartitions

log = logging.getLogger(__name__)

RETRY_SLEEP_S = 0.5
MAX_BATCH_SIZE = 500
MAX_PARALLEL_PARTITIONS = 16
METADATA_WAIT_S = 30.0
COMMIT_HINT_INTERVAL_S = 1.0
"""How often Kafka is told the consumer's offsets (a hint: the database is the truth)."""
LAG_SAMPLE_INTERVAL_S = 1.0
REDIS_WARN_INTERVAL_S = 30.0

_RECORD_PROCESSED = (
    'INSERT INTO processed_events (consumer, event_id, topic, partition, "offset")'
    " SELECT %s, e.id, e.t, e.p, e.o FROM unnest(%b::uuid[], %b::text[], %b::int[], %b::bigint[]) AS e (id, t, p, o)"
    ' ON CONFLICT DO NOTHING RETURNING topic, partition, "offset"'
)
_SAVE_POSITIONS = (
    "INSERT INTO consumer_positions (consumer, topic, partition, next_offset)"
    " SELECT %s, p.t, p.p, p.n FROM unnest(%b::text[], %b::int[], %b::bigint[]) AS p (t, p, n)"
    " ON CONFLICT (consumer, topic, partition)"
    " DO UPDATE SET next_offset = greatest(consumer_positions.next_offset, EXCLUDED.next_offset)"
)


@dataclass(frozen=True, slots=True)
class _Part:
    """A partition's share of a transaction: its records to apply, and its position after them."""

    tp: TopicPartition
    items: list[tuple[Any, events_pb2.EventEnvelope]]
    next_offset: int


class ExactlyOnceConsumer:
    """Apply events from ``topics`` through ``handler``, each effect exactly once.

    ``event_types`` (or a ``SelectiveHandler``'s): the event types the handler acts on. Others are skipped without a
    transaction (no tracking row: skipping twice is harmless), so a consumer of a few
    event types does not pay a database round trip for every event on its topics.
    ``batch_size`` records are applied in one transaction: a partition's, or those of all
    the partitions a poll brought when they fit (``_apply_together``); with
    ``pipeline`` the handlers' statements of a batch go to PostgreSQL in one round
    trip with the positions and the COMMIT (for handlers that read no result they depend
    on, e.g. a projection's upserts). A transaction's BEGIN goes with its tracking rows
    and its COMMIT with its positions (``backbone.db.framed``): two round trips of its own.
    A ``BatchHandler`` gets the batch's new events in one call instead.
    ``parallel_partitions`` > 1: the partitions a poll brought are applied side by side, up to
    that many at once, each in its own transactions (a partition's records still in order).
    For handlers that take their row locks in one order whatever the record, so that side by
    side they wait for each other instead of deadlocking (the wallet's settlements: accounts
    by name, then holds), and whose effects do not depend on the order of partitions.
    """

    def __init__(
        self,
        name: str,
        topics: Sequence[str],
        pool: AsyncConnectionPool,
        handler: Handler | BatchHandler,
        kafka_consumer: KafkaConsumer,
        *,
        poll_timeout_ms: int = 200,
        batch_size: int = 500,
        event_types: Collection[str] | None = None,
        pipeline: bool = False,
        leases: PartitionLeases | None = None,
        parallel_partitions: int = 1,
    ) -> None:
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be 1..{MAX_BATCH_SIZE}")
        if not 1 <= parallel_partitions <= MAX_PARALLEL_PARTITIONS:
            raise ValueError(f"parallel_partitions must be 1..{MAX_PARALLEL_PARTITIONS}")
        self._batch_size = batch_size
        self._parallel_partitions = parallel_partitions
        self.name = name
        self.topics = list(topics)
        self._pool = pool
        self._handler: Handler | None = None
        self._apply_many: ApplyMany | None = None
        if isinstance(handler, BatchHandler):
            self._apply_many = handler.apply_many
            if event_types is None:
                event_types = handler.event_types
        else:
            self._handler = handler
        self._kafka = kafka_consumer
        self._poll_timeout_ms = poll_timeout_ms
        if event_types is None and isinstance(handler, SelectiveHandler):
            event_types = handler.event_types
        self._event_types = frozenset(event_types) if event_types is not None else None
        self._pipeline = pipeline
        self._subscribed = False
        self._metered = False
        # Next offset per partition as last read from or written to consumer_positions;
        # dropped when the assignment changes (another member may have moved it).
        self._positions: dict[TopicPartition, int] = {}
        self._assignment: set[TopicPartition] = set()
        self._hints: dict[TopicPartition, int] = {}
        self._hinted_at = 0.0
        self._lag_sampled_at = 0.0
        self._leases = leases
        self._shared_at = float("-inf")
        self._redis_warned_at = 0.0
        # Test seam: called after a record's transaction committed.
        self.after_commit: Callable[[Any], Awaitable[None]] | None = None

    @staticmethod
    async def setup(conn: psycopg.AsyncConnection) -> None:
        await run_ddl(conn, TRACKING_SCHEMA)

    async def poll_once(self) -> int:
        """Poll once and apply what came; returns the number of events applied (duplicates excluded)."""
        if self._leases is not None:
            if not await self._take_share():
                await asyncio.sleep(self._poll_timeout_ms / 1000)
                return 0
        elif not self._subscribed:
            await asyncio.to_thread(self._await_topic_metadata)
            self._kafka.subscribe(self.topics)
            self._subscribed = True
        if not self._metered:
            self._metered = True
            for topic in self.topics:  # series exist from the start, so the first increase shows in rate()
                metrics.CONSUMER_DUPLICATES.labels(self.name, topic)
                metrics.CONSUMER_FAILURES.labels(self.name, topic)
                metrics.CONSUMER_APPLIED.labels(self.name, topic)
        batches = await asyncio.to_thread(self._kafka.poll, self._poll_timeout_ms)
        assignment = set(self._kafka.assignment())
        if assignment != self._assignment:
            self._assignment = assignment
            self._positions.clear()
        try:
            applied = await self._apply_polled(batches)
        except StalePartitions as error:
            # Another replica owns these now (its token is newer): what this poll applied of the others
            # stays, the rest is read again from the stored positions once the share is taken again.
            log.warning("consumer deposed from partitions", extra={"consumer": self.name, "error": str(error)})
            assert self._leases is not None
            self._leases.lose(error.parts)
            self._shared_at = float("-inf")
            self._reread(batches)
            return 0
        except BaseException:
            # Kafka has moved past what this poll brought, applied or not (a failure outside a handler:
            # the database unreachable for the stored position, a side-by-side partition cancelled):
            # read it all again; what landed is recognised by its stored position and skipped.
            self._reread(batches)
            raise
        now = time.monotonic()
        if self._hints and now - self._hinted_at >= COMMIT_HINT_INTERVAL_S:
            await self._commit_hints()
        if now - self._lag_sampled_at >= LAG_SAMPLE_INTERVAL_S:
            self._lag_sampled_at = now
            # position() can wait on the broker (1 s a partition while it is down): never on the loop.
            await asyncio.to_thread(self._record_lag)
        return applied

    async def _take_share(self) -> bool:
        """Every third of the leases' time to live: this replica's share of the partitions, assigned
        from where the database (or Kafka's hint) says when it changed. Returns whether it holds any.

        The leases only divide the work: the database keeps every effect exactly once whoever
        applies it, and every transaction checks its partitions' fences. So while Redis cannot be
        reached the consumer goes on applying the partitions it held rather than stopping the
        service's consumption with it (their leases run out meanwhile for everyone).
        """
        assert self._leases is not None
        now = time.monotonic()
        if now - self._shared_at < self._leases.ttl_ms / 3000:
            return bool(self._assignment)
        self._shared_at = now
        parts = await asyncio.to_thread(self._all_partitions)
        try:
            held = {TopicPartition(topic, partition) for topic, partition in await self._leases.refresh(parts)}
        except Exception as error:  # Redis unreachable: not a reason to stop applying
            if now - self._redis_warned_at > REDIS_WARN_INTERVAL_S:
                self._redis_warned_at = now
                log.warning("consumer leases unreachable; applying what it held", extra={"error": repr(error)})
            held = {TopicPartition(topic, partition) for topic, partition in self._leases.held}
        if held != self._assignment:
            await self._assign(held)
        return bool(held)

    async def _assign(self, partitions: set[TopicPartition]) -> None:
        """Assign ``partitions``, each from where the database (or Kafka's hint) says."""
        self._kafka.assign(sorted(partitions))  # none: unsubscribes
        self._subscribed = bool(partitions)
        self._assignment = set(partitions)
        self._positions.clear()
        self._hints = {tp: offset for tp, offset in self._hints.items() if tp in partitions}
        for tp in sorted(partitions):
            stored = await self._stored_position(tp)
            hint = await asyncio.to_thread(self._kafka.committed, tp)
            start = max(stored, hint or 0)
            if start > 0:
                self._kafka.seek(tp, start)
            else:
                self._kafka.seek_to_beginning(tp)
        log.info("consumer took its share", extra={"consumer": self.name, "partitions": len(partitions)})

    def _all_partitions(self) -> set[TopicPartition]:
        self._await_topic_metadata()
        return {
            TopicPartition(topic, partition)
            for topic in self.topics
            for partition in self._kafka.partitions_for_topic(topic) or ()
        }

    def _await_topic_metadata(self) -> None:
        """Know every topic's partitions before joining the group.

        A member that joins before a new topic's metadata reached it gets no partitions
        of that topic, and kafka-python may not rebalance for minutes; fetching the
        metadata first closes that window.
        """
        deadline = time.monotonic() + METADATA_WAIT_S
        for topic in self.topics:
            while not self._kafka.partitions_for_topic(topic):
                if time.monotonic() > deadline:
                    log.warning("no partitions known for topic; subscribing anyway", extra={"topic": topic})
                    return
                time.sleep(0.2)

    async def _apply_polled(self, batches: dict[TopicPartition, list[Any]]) -> int:
        if len(batches) > 1 and sum(len(records) for records in batches.values()) <= self._batch_size:
            return await self._apply_together(batches)
        if len(batches) > 1 and self._parallel_partitions > 1:
            return await self._apply_side_by_side(batches)
        applied = 0
        for tp, records in batches.items():
            applied += await self._apply_records(tp, records)
        return applied

    async def _apply_records(self, tp: TopicPartition, records: list[Any]) -> int:
        """A partition's records, ``batch_size`` a transaction; returns how many were new."""
        applied = 0
        for first in range(0, len(records), self._batch_size):
            done, complete = await self._apply_partition(tp, records[first : first + self._batch_size])
            applied += done
            if not complete:  # the partition is read again from its failed record: nothing after it first
                break
        return applied

    async def _apply_together(self, batches: dict[TopicPartition, list[Any]]) -> int:
        """A poll's records of several partitions in ONE transaction (they fit in a batch).

        Under a steady trickle a poll brings a few records from each of several partitions:
        one transaction for all of them instead of one each. Partitions are independent
        (an event's partition is its stream's), so applying them together, partition after
        partition, has the effects of applying them one partition at a time. If it fails,
        nothing of it was committed, and each partition is applied on its own as usual.
        """
        read = [(tp, fresh) for tp, records in batches.items() if (fresh := await self._unread(tp, records))]
        parts = [_Part(tp, self._wanted(fresh), fresh[-1].offset + 1) for tp, fresh in read]
        applied = 0
        if any(part.items for part in parts):  # else nothing the handler acts on: no transaction
            try:
                applied = await self._apply_batch([part for part in parts if part.items])
            except StalePartitions:
                raise
            except Exception:
                for tp, fresh in read:
                    applied += await self._apply_records(tp, fresh)
                return applied
        for tp, fresh in read:
            self._advance(tp, fresh[-1].offset + 1)
            await self._after_commit(fresh)
        return applied

    async def _apply_side_by_side(self, batches: dict[TopicPartition, list[Any]]) -> int:
        """Each partition's records as ``_apply_records`` applies them, ``parallel_partitions`` partitions
        at once. If one fails outside its handler, the others are cancelled (their transactions roll
        back) and the poll fails, as it would partition after partition."""
        gate = asyncio.Semaphore(self._parallel_partitions)

        async def apply(tp: TopicPartition, records: list[Any]) -> int:
            async with gate:
                return await self._apply_records(tp, records)

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(apply(tp, records)) for tp, records in batches.items()]
        return sum(task.result() for task in tasks)

    def _reread(self, batches: dict[TopicPartition, list[Any]]) -> None:
        for tp, records in batches.items():
            if records:
                try:
                    self._kafka.seek(tp, records[0].offset)
                except Exception as error:  # no longer assigned: its next owner reads from the stored position
                    log.info("consumer could not seek back", extra={"topic": tp.topic, "error": repr(error)})

    async def _unread(self, tp: TopicPartition, records: list[Any]) -> list[Any]:
        """The records at or past the partition's stored position (the others are counted as duplicates)."""
        next_offset = await self._stored_position(tp)
        fresh = [r for r in records if r.offset >= next_offset]
        if len(fresh) < len(records):
            metrics.CONSUMER_DUPLICATES.labels(self.name, tp.topic).inc(len(records) - len(fresh))
        return fresh

    def _wanted(self, records: list[Any]) -> list[tuple[Any, events_pb2.EventEnvelope]]:
        """The records with their envelopes, of the event types the handler acts on."""
        items = [(record, _envelope(record)) for record in records]
        return [(r, e) for r, e in items if self._event_types is None or e.event_type in self._event_types]

    async def _apply_partition(self, tp: TopicPartition, records: list[Any]) -> tuple[int, bool]:
        """Apply one batch of a partition's records; returns how many were new and whether all landed."""
        fresh = await self._unread(tp, records)
        if not fresh:
            return 0, True
        wanted = self._wanted(fresh)
        if not wanted:  # nothing the handler acts on: no transaction, no tracking row
            self._advance(tp, fresh[-1].offset + 1)
            await self._after_commit(fresh)
            return 0, True
        try:
            applied = await self._apply_batch([_Part(tp, wanted, fresh[-1].offset + 1)])
        except StalePartitions:
            raise
        except Exception:
            # Something in the batch failed and nothing of it was committed: go one by one
            # so every record before the failing one lands, then retry from the failing one.
            # Kafka's offset is left alone here: it may lag the database, never lead it.
            return await self._apply_one_by_one(tp, wanted)
        self._advance(tp, fresh[-1].offset + 1)
        await self._after_commit(fresh)
        return applied, True

    def _advance(self, tp: TopicPartition, next_offset: int) -> None:
        self._positions[tp] = max(next_offset, self._positions.get(tp, 0))
        self._hints[tp] = next_offset

    async def _commit_hints(self) -> None:
        """Tell Kafka where we are (for lag dashboards and a faster resume); the database is the truth."""
        hints, self._hints = self._hints, {}
        self._hinted_at = time.monotonic()
        offsets = {tp: OffsetAndMetadata(offset, "", -1) for tp, offset in hints.items() if tp in self._assignment}
        if not offsets:
            return
        try:
            await asyncio.to_thread(self._kafka.commit, offsets)
        except Exception as error:  # e.g. a rebalance in progress: the next commit catches up
            log.info("kafka offset commit skipped", extra={"error": repr(error)})

    async def _apply_one_by_one(
        self, tp: TopicPartition, items: list[tuple[Any, events_pb2.EventEnvelope]]
    ) -> tuple[int, bool]:
        """Apply the records one at a time up to the first that fails; returns (new, all landed).

        The partition is then read again from the failed record, and the caller must apply none
        of the partition's later records before it (they would move the stored position past it,
        and the failed record would be skipped as already applied).
        """
        applied = 0
        for record, envelope in items:
            try:
                applied += await self._apply_batch([_Part(tp, [(record, envelope)], record.offset + 1)])
            except StalePartitions:
                raise
            except Exception:
                metrics.CONSUMER_FAILURES.labels(self.name, tp.topic).inc()
                log.exception("handler failed; will retry", extra={"topic": tp.topic, "offset": record.offset})
                self._kafka.seek(tp, record.offset)  # re-read it on the next poll
                await asyncio.sleep(RETRY_SLEEP_S)
                return applied, False
            self._advance(tp, record.offset + 1)
            await self._after_commit([record])
        return applied, True

    async def _after_commit(self, records: list[Any]) -> None:
        if self.after_commit is not None:
            for record in records:
                await self.after_commit(record)

    async def _apply_batch(self, parts: list[_Part]) -> int:
        """Apply the parts' records in one transaction, partition after partition; returns how many were new.

        The BEGIN travels with the tracking rows' statement and the COMMIT with the positions' (``framed``):
        the transaction's own round trips are those two, and its handler's (one for all of it when the
        handler is ``pipeline``-safe, its writes then going with the positions and the COMMIT)."""
        items = [(part.tp, record, envelope) for part in parts for record, envelope in part.items]
        async with self._pool.connection() as conn, framed(conn) as tx:
            # The records whose event id was not yet recorded: a partition's offsets are distinct, and
            # of one event published twice in the batch only the first row is inserted.
            async with conn.pipeline():
                await tx.begin()
                cur = await conn.execute(
                    _RECORD_PROCESSED,
                    (
                        self.name,
                        [e.event_id for _, _, e in items],
                        [tp.topic for tp, _, _ in items],
                        [tp.partition for tp, _, _ in items],
                        [r.offset for _, r, _ in items],
                    ),
                )
                if self._leases is not None:  # reads its result: the round trip of the tracking rows' too
                    await self._leases.check(conn, [part.tp for part in parts])
            new = {(topic, partition, offset) for topic, partition, offset in await cur.fetchall()}
            fresh = [(tp, r, e) for tp, r, e in items if (tp.topic, tp.partition, r.offset) in new]
            applied = Counter(tp.topic for tp, _, _ in fresh)
            for topic, count in (Counter(tp.topic for tp, _, _ in items) - applied).items():
                metrics.CONSUMER_DUPLICATES.labels(self.name, topic).inc(count)  # published twice: applied before
            if not self._pipeline:
                await self._handle(conn, fresh)
            async with conn.pipeline():
                if self._pipeline:
                    await self._handle(conn, fresh)
                await conn.execute(
                    _SAVE_POSITIONS,
                    (
                        self.name,
                        [part.tp.topic for part in parts],
                        [part.tp.partition for part in parts],
                        [part.next_offset for part in parts],
                    ),
                )
                await tx.commit()
        for topic, count in applied.items():
            metrics.CONSUMER_APPLIED.labels(self.name, topic).inc(count)
        return sum(applied.values())

    async def _handle(
        self, conn: psycopg.AsyncConnection, fresh: list[tuple[TopicPartition, Any, events_pb2.EventEnvelope]]
    ) -> None:
        """The handler's effects of the batch's new records, in their order (a CONSUMER span for each
        record that carries a trace context, backbone/tracing.py)."""
        with tracing.consumer_spans(self.name, [(tp.topic, r.headers, e.event_type) for tp, r, e in fresh]):
            if self._apply_many is not None:
                if fresh:
                    await self._apply_many(conn, [Tracked(e, tp.topic, tp.partition, r.offset) for tp, r, e in fresh])
                return
            assert self._handler is not None
            for _, _, envelope in fresh:
                token = logs.correlation_id.set(envelope.correlation_id)
                try:
                    await self._handler(conn, envelope)
                finally:
                    logs.correlation_id.reset(token)

    async def _stored_position(self, tp: TopicPartition) -> int:
        known = self._positions.get(tp)
        if known is not None:
            return known
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT next_offset FROM consumer_positions WHERE consumer = %s AND topic = %s AND partition = %s",
                (self.name, tp.topic, tp.partition),
            )
            row = await cur.fetchone()
        self._positions[tp] = int(row[0]) if row else 0
        return self._positions[tp]

    def _record_lag(self) -> None:
        for tp in self._kafka.assignment():
            high = self._kafka.highwater(tp)
            if high is None:
                continue
            try:
                position = self._kafka.position(tp, timeout_ms=1000)
            except Exception:  # position unknown during a rebalance; skip this sample
                continue
            metrics.CONSUMER_LAG.labels(self.name, tp.topic, str(tp.partition)).set(max(0, high - position))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.poll_once()
            except Exception:
                log.exception("consumer poll failed; retrying")
                await asyncio.sleep(1.0)
        if self._hints:
            await self._commit_hints()
        await asyncio.to_thread(self._kafka.close)
        if self._leases is not None:
            with contextlib.suppress(Exception):
                await self._leases.leave()


def _envelope(record: Any) -> events_pb2.EventEnvelope:
    envelope = events_pb2.EventEnvelope()
    envelope.ParseFromString(record.value)
    return envelope
