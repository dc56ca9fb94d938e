"""Take out of a service's database what a verified archive holds (``backbone.archive``).

Three kinds of rows go, each only when nothing can need it again:

* the outbox's published rows below the archive's ``archived_below`` for the service: the
  relay reads unpublished rows only, and the records they became are in the archive;
* the event store's events below ``archived_below`` that belong to a round the archive saw
  end (``table.round_settled`` / ``table.round_voided``), but the last event of each stream:
  an append checks the stream's last version (``niuniu_append_event``), and the wallet takes
  its store position from the last event, so every stream keeps its head;
* the consumers' tracking rows (``processed_events``) of a partition below the archive's
  ``safe`` offset for it, once the consumer's stored position is past the archive's
  ``last_copy`` of that partition. Exactly once still holds: a record is read again only from
  the consumer's stored position, and every copy of those events lies below the archive's end
  (their producers had every copy acknowledged before the end was read), the repeated ones
  before ``last_copy``: the consumer has read, and skipped, each of them already. (A consumer
  stores its position with the records it applies; one that only skipped the records after its
  last applied one may stand below the archive's end, which is why the end is not the test.)

Each kind is one statement in a transaction of its own; the command runs again safely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from backbone.archive import Header

HOT_TABLES = ("events", "outbox", "processed_events")


@dataclass
class Pruned:
    """What one database lost, and what it kept for a reason."""

    outbox: int = 0
    events: int = 0
    processed: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TableSize:
    rows: int
    data_bytes: int  # the rows' own bytes (``pg_column_size``): what pruning takes away at once
    disk_bytes: int  # ``pg_total_relation_size``: the table with its indexes; freed pages are reused


async def hot_tier(conn: psycopg.AsyncConnection, tables: Sequence[str] = HOT_TABLES) -> dict[str, TableSize]:
    """Each of ``tables`` there is (in the connection's search path): rows, their bytes, its size on disk."""
    sizes: dict[str, TableSize] = {}
    for table in tables:
        if not await _exists(conn, table):
            continue
        cur = await conn.execute(
            sql.SQL(
                "SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0), pg_total_relation_size({}) FROM {} t"
            ).format(sql.Literal(table), sql.Identifier(table))
        )
        row = await cur.fetchone()
        if row is not None:
            sizes[table] = TableSize(int(row[0]), int(row[1]), int(row[2]))
    return sizes


async def vacuum(conn: psycopg.AsyncConnection, tables: Sequence[str] = HOT_TABLES) -> None:
    """VACUUM the pruned tables (``conn`` in autocommit): their freed pages are reused from now on."""
    for table in tables:
        if await _exists(conn, table):
            await conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(table)))


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
    ``safe`` offsets, partition by partition, where the consumer's position is past the ``last_copy``."""
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
            if reached <= part.last_copy:
                pruned.notes.append(
                    f"{consumer} has read {part.topic}[{part.partition}] up to {reached}, not yet past the"
                    f" archive's last repeated record {part.last_copy}: its tracking rows stay"
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
