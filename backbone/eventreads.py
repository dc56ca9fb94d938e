"""Reads of the event store for a service's own views: a stream with the streams under it, and the
positions of one event type in a stream.

The store's ``events`` table is the backbone's (``eventstore.py``); a service reads it through these
functions and ``EventStore``'s methods, never with SQL of its own. A stream's sub-streams are those
named after it and a dot (a table's ``table-t1`` and its bets' ``table-t1.bet-...``).
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from backbone.eventstore import StoredEvent, stored_event

FAMILY_SCHEMA = (
    "CREATE INDEX IF NOT EXISTS events_stream_prefix_idx ON events (stream_id text_pattern_ops, position)",
)
"""The index ``read_family`` reads by. In a service's database the event store's migration
eventstore-family-0001 makes it (``migrations.store_migrations(..., family_reads=True)``); this is for
scratch schemas and tests."""


def _under(stream_id: str) -> str:
    """The LIKE pattern of ``stream_id``'s sub-streams (its underscores taken literally)."""
    return stream_id.replace("_", r"\_") + ".%"


async def read_family(
    conn: psycopg.AsyncConnection, stream_id: str, after_position: int, limit: int
) -> list[StoredEvent]:
    """The events of ``stream_id`` and of its sub-streams after ``after_position``, in position order."""
    cur = await conn.execute(
        "SELECT position, envelope FROM events WHERE (stream_id = %s OR stream_id LIKE %s) AND position > %s"
        " ORDER BY position LIMIT %s",
        (stream_id, _under(stream_id), after_position, limit),
    )
    return [stored_event(row) for row in await cur.fetchall()]


async def in_family(conn: psycopg.AsyncConnection, stream_id: str, position: int) -> bool:
    """The event at ``position`` is one of ``stream_id``'s or of its sub-streams'."""
    cur = await conn.execute(
        "SELECT 1 FROM events WHERE position = %s AND (stream_id = %s OR stream_id LIKE %s)",
        (position, stream_id, _under(stream_id)),
    )
    return await cur.fetchone() is not None


async def last_position_of(
    conn: psycopg.AsyncConnection, stream_id: str, event_type: str, at_most: int | None = None
) -> int | None:
    """The position of the stream's last event of ``event_type`` (at or before ``at_most``), None if none."""
    cur = await conn.execute(
        "SELECT max(position) FROM events WHERE stream_id = %s AND event_type = %s AND position <= %s",
        (stream_id, event_type, at_most if at_most is not None else 2**63 - 1),
    )
    row = await cur.fetchone()
    return int(row[0]) if row and row[0] is not None else None


async def nth_last_position_of(conn: psycopg.AsyncConnection, stream_id: str, event_type: str, n: int) -> int | None:
    """The position of the stream's ``n``-th last event of ``event_type`` (1: the last), None if fewer."""
    cur = await conn.execute(
        "SELECT position FROM events WHERE stream_id = %s AND event_type = %s ORDER BY position DESC OFFSET %s LIMIT 1",
        (stream_id, event_type, n - 1),
    )
    row = await cur.fetchone()
    return int(row[0]) if row else None


async def last_position(conn: psycopg.AsyncConnection) -> int:
    """The store's last position (0 when empty)."""
    cur = await conn.execute("SELECT coalesce(max(position), 0) FROM events")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def read_correlated_many(conn: psycopg.AsyncConnection, correlation_ids: Sequence[str]) -> list[StoredEvent]:
    """The events of several correlation ids (a table's rounds, say) in one read, in position order."""
    cur = await conn.execute(
        "SELECT position, envelope FROM events WHERE correlation_id = ANY(%s) ORDER BY position",
        (list(correlation_ids),),
    )
    return [stored_event(row) for row in await cur.fetchall()]
