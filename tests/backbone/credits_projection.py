"""A tiny projection used by the backbone's contract tests: credits per account."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from google.protobuf import struct_pb2
from niuniu.v1 import events_pb2

from backbone.eventstore import NewEvent
from backbone.handlers import Tracked
from backbone.replay.model import Projection

CREDITS_DDL = (
    "CREATE TABLE IF NOT EXISTS credits (account TEXT PRIMARY KEY, total BIGINT NOT NULL, applied INT NOT NULL)",
)


def credited(account: str, amount: int, correlation_id: str = "") -> NewEvent:
    payload = struct_pb2.Struct()
    payload.update({"account": account, "amount": amount})
    return NewEvent("test.credited", payload, correlation_id=correlation_id)


async def apply_credit(conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> None:
    payload = struct_pb2.Struct()
    envelope.payload.Unpack(payload)
    await conn.execute(
        "INSERT INTO credits (account, total, applied) VALUES (%s, %s, 1) ON CONFLICT (account)"
        " DO UPDATE SET total = credits.total + EXCLUDED.total, applied = credits.applied + 1",
        (payload.fields["account"].string_value, int(payload.fields["amount"].number_value)),
    )


async def apply_credits(conn: psycopg.AsyncConnection, batch: Sequence[Tracked]) -> None:
    """``apply_credit`` of each event in turn, in one statement (a consumer's batch handler)."""
    totals: dict[str, list[int]] = {}
    for tracked in batch:
        payload = struct_pb2.Struct()
        tracked.envelope.payload.Unpack(payload)
        total = totals.setdefault(payload.fields["account"].string_value, [0, 0])
        total[0] += int(payload.fields["amount"].number_value)
        total[1] += 1
    await conn.execute(
        "INSERT INTO credits (account, total, applied) SELECT * FROM unnest(%s::text[], %s::bigint[], %s::int[])"
        " ON CONFLICT (account) DO UPDATE SET total = credits.total + EXCLUDED.total,"
        " applied = credits.applied + EXCLUDED.applied",
        (list(totals), [t[0] for t in totals.values()], [t[1] for t in totals.values()]),
    )


CREDITS = Projection(name="credits", ddl=CREDITS_DDL, handler=apply_credit, tables=("credits",))


async def credits(conn: psycopg.AsyncConnection) -> dict[str, tuple[int, int]]:
    cur = await conn.execute("SELECT account, total, applied FROM credits ORDER BY account")
    return {row[0]: (int(row[1]), int(row[2])) for row in await cur.fetchall()}
