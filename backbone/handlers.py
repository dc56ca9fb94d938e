"""What a consumer applies: handlers of one event or of a batch, the events they are given with their
Kafka positions, and the tables in which a consumer records what it applied.

Kept apart from ``backbone.consumer`` (Kafka, Redis leases, tracing) so that a projection and the
replay that rebuilds it import only this: a replay worker starts in a fraction of the time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

import psycopg
from niuniu.v1 import events_pb2

Handler = Callable[[psycopg.AsyncConnection, events_pb2.EventEnvelope], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SelectiveHandler:
    """A handler that acts on ``event_types`` only: the consumer skips the others without a transaction."""

    event_types: frozenset[str]
    handler: Handler

    async def __call__(self, conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> None:
        if envelope.event_type in self.event_types:
            await self.handler(conn, envelope)


def handling(event_types: Collection[str], handler: Handler) -> SelectiveHandler:
    return SelectiveHandler(frozenset(event_types), handler)


@dataclass(frozen=True, slots=True)
class Tracked:
    """An event with the Kafka position it was read from."""

    envelope: events_pb2.EventEnvelope
    topic: str
    partition: int
    offset: int


ApplyMany = Callable[[psycopg.AsyncConnection, Sequence[Tracked]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class BatchHandler:
    """A handler that applies a batch's new events in one call, in order, with the effects of
    applying each in turn (one statement for many events instead of one each).

    ``event_types``: as ``SelectiveHandler``'s (None: every event)."""

    apply_many: ApplyMany
    event_types: frozenset[str] | None = None


def batched(apply_many: ApplyMany, event_types: Collection[str] | None = None) -> BatchHandler:
    return BatchHandler(apply_many, None if event_types is None else frozenset(event_types))


TRACKING_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS consumer_positions (
        consumer     TEXT NOT NULL,
        topic        TEXT NOT NULL,
        partition    INT NOT NULL,
        next_offset  BIGINT NOT NULL,
        PRIMARY KEY (consumer, topic, partition)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS processed_events (
        consumer    TEXT NOT NULL,
        event_id    UUID NOT NULL,
        topic       TEXT NOT NULL,
        partition   INT NOT NULL,
        "offset"    BIGINT NOT NULL,
        applied_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (consumer, event_id)
    )
    """,
)
