"""What a replay rebuilds and reports: the projection (DDL, handler, optional batch writers), the records
read before Kafka's, and the COPY text the replay's writes are made of."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import psycopg
from kafka import TopicPartition

from backbone.handlers import ApplyMany, Handler, Tracked


class StagedBatch(Protocol):
    """A poll prepared by a projection's stager (pure work, done on a worker thread)."""

    async def write(self, conn: psycopg.AsyncConnection, stale: frozenset[int]) -> None:
        """Apply the events of the poll whose index is in ``replay_fresh`` (``stale``: the other indexes)."""

    async def write_all_new(self, conn: psycopg.AsyncConnection) -> None:
        """Apply every event of the poll, with plain inserts: a row its effects would skip (one there
        already) raises ``UniqueViolation``, and the replay then undoes this and calls ``write``."""


# Prepares the poll's events (index = position in the sequence) for writing; no I/O.
Stager = Callable[[Sequence[Tracked]], StagedBatch]
# Shown each poll a replay reads, in the order read (on the replay's worker thread); no I/O.
Observer = Callable[[Sequence[Tracked]], None]


@dataclass(frozen=True, slots=True)
class Projection:
    name: str
    ddl: Sequence[str]
    handler: Handler
    tables: Sequence[str]
    # Optional: applies several events (new ones, in order) with the effects of ``handler`` on each.
    batch_handler: ApplyMany | None = None
    # Optional, replay only: prepares a whole poll off the event loop; its ``write`` applies the fresh
    # events with the effects of ``handler`` on each, in order. ``stage_ddl``: its temporary tables.
    stager: Stager | None = None
    stage_ddl: Sequence[str] = ()
    # Replay only: unique constraints (by name) no write of the projection relies on, because applying
    # each event once already keeps them: built at the end of a replay instead of row by row.
    implied_unique: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class Archived:
    """Records read before Kafka's (``backbone.archive``): their batches, in order, and per partition the
    offset Kafka is read from after them (the archive's end)."""

    batches: Iterable[Sequence[Tracked]]
    starts: Mapping[TopicPartition, int]


class ReplayGap(RuntimeError):
    """Kafka no longer holds records the replay needs (deleted by retention, and not given by an archive)."""


@dataclass(frozen=True, slots=True)
class ReplayReport:
    schema: str
    events_read: int
    events_applied: int
    seconds: float


def fresh_stage(on_commit: str = "DELETE ROWS") -> str:
    """The indexes of a batch's events applied for the first time, as a ``StagedBatch`` reads them."""
    return f"CREATE TEMP TABLE IF NOT EXISTS replay_fresh (n INT PRIMARY KEY) ON COMMIT {on_commit}"


FRESH_STAGE = fresh_stage()


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_text(value: str) -> str:
    """``value`` as a field of PostgreSQL's COPY text format."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_COPY_ESCAPES)
    return value
