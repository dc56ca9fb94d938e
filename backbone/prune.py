"""Take out of a service's database what a verified archive holds (``backbone.archive``).

Three kinds of rows go, each only when nothing can need it again:

* the outbox's published rows below the archive's ``archived_below`` for the service: the
  relay reads unpublished rows only, and the records they became are in the archive;
* the event store's events below ``archived_below`` that belong to a round the archive saw
  end (``table.round_settled`` / ``table.round_voided``), but the last event of each stream:
  an append checks the stream's last version (``niuniu_append_event``), and the wallet takes
  its store position from the last event, so every stream keeps its head;
* the consumers' tracking rows (``processed_events``) of a partition below the archive's
  ``safe`` offset for it, once the consumer has read up to the archive's end of that partition.
  Exactly once still holds: a record is read again only from the consumer's stored position
  (at or past the archive's end), and no record past it can carry one of those events, as
  their producers had every copy acknowledged before the archive's end was read.

Each kind is one statement in a transaction of its own; the command runs again safely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg

from backbone.archive import Header

HOT_TABLES = ("events", "outbox", "processed_events")


@dataclass
class Pruned:
    """What one database lost, and what it kept for a reason."""

    outbox: int = 0
    events: int = 0
    processed: int = 0
    notes: list[str] = field(default_factory=list)


async def table_sizes(conn: psycopg.AsyncConnection, tables: Sequence[str] = HOT_TABLES) -> dict[str, int]:
    """``pg_total_relation_size`` of each of ``tables`` there is (in the connection's search path)."""
    sizes: dict[str, int] = {}
    for table in tables:
        cur = await conn.execute("SELECT pg_total_relation_size(to_regclass(%s))", (table,))
        row = await cur.fetchone()
        if row is not None and row[0] is not None:
            sizes[table] = int(row[0])
    return sizes


async def _exists(conn: psycopg.AsyncConnection, table: str) -> bool:
    cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))
    row = await cur.fetchone()
    return bool(row and row[0])


async def prune_store(
    conn: psycopg.AsyncConnection, service: str, headers: Sequence[Header], older_than_s: float
) -> Pruned:
    """Prune ``service``'s outbox and event store (``conn``: its database, autocommit) of what the
    archive holds; events younger than ``older_than_s`` stay."""
    pruned = Pruned()
    below = max((h.archived_below.get(service, 0) for h in headers), default=0)
    if below <= 1 or not await _exists(conn, "events"):
        pruned.notes.append(f"{service}: the archive holds none of its events")
        return pruned
    closed = sorted({r for h in headers for r in h.closed_rounds})
    async with conn.transaction():
        cur = await conn.execute("DELETE FROM outbox WHERE position < %s AND published_at IS NOT NULL", (below,))
        pruned.outbox = cur.rowcount
    async with conn.transaction():
        cur = await conn.execute(
            "DELETE FROM events e WHERE e.position < %s AND e.correlation_id = ANY(%s)"
            " AND e.occurred_at < now() - make_interval(secs => %s)"
            " AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.position = e.position)"
            " AND e.version < (SELECT max(h.version) FROM events h WHERE h.stream_id = e.stream_id)",
            (below, closed, older_than_s),
        )
        pruned.events = cur.rowcount
    return pruned


async def prune_processed(conn: psycopg.AsyncConnection, headers: Sequence[Header]) -> Pruned:
    """Prune the tracking rows of every consumer in ``conn``'s database below the last segment's
    ``safe`` offsets, partition by partition, where the consumer has read up to the segment's end."""
    pruned = Pruned()
    if not headers or not await _exists(conn, "processed_events"):
        return pruned
    last = headers[-1]
    cur = await conn.execute("SELECT consumer, topic, partition, next_offset FROM consumer_positions")
    positions = {(str(c), str(t), int(p)): int(n) for c, t, p, n in await cur.fetchall()}
    for consumer in sorted({c for c, _, _ in positions}):
        for part in last.partitions:
            reached = positions.get((consumer, part.topic, part.partition))
            if reached is None:
                continue
            if reached < part.end:
                pruned.notes.append(
                    f"{consumer} has read {part.topic}[{part.partition}] up to {reached}, not yet to the archive's"
                    f" end {part.end}: its tracking rows stay"
                )
                continue
            async with conn.transaction():
                cur = await conn.execute(
                    "DELETE FROM processed_events"
                    ' WHERE consumer = %s AND topic = %s AND partition = %s AND "offset" < %s',
                    (consumer, part.topic, part.partition, part.safe),
                )
                pruned.processed += cur.rowcount
    return pruned
