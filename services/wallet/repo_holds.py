"""The wallet's holds: placed, resized and resolved (``wallet_holds``, ``wallet_hold_resizes``), and
what PlaceHold reads of a group of holds before deciding them.

A hold's one resolution is guarded in its statement (``status = 'open'``), so a second one fails the
transaction instead of moving money twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from backbone.db import each_by_key
from services.wallet.domain import HoldStatus
from services.wallet.domain_holds import Hold, HoldRequest, Resize, ResizeRequest
from services.wallet.domain_play import Exclusion, LimitKind, LimitSetting
from services.wallet.repo import LOCK_ACCOUNTS, LockedAccount, locked_from_rows

_HOLD_COLUMNS = (
    "hold_id, account, amount_minor, reason, round_id, requested_expires_at_ms, expires_at, placed_at, status,"
    " posted_minor, released_minor, resolved_at, resolved_by, postings, resized_minor"
)


def holds_from_rows(rows: Iterable[Sequence[Any]]) -> dict[str, Hold]:
    return {h.hold_id: h for h in map(_hold, rows)}


def _hold(r: Sequence[Any]) -> Hold:
    return Hold(
        HoldRequest(r[0], r[1], int(r[2]), r[3], r[4], int(r[5])),
        expires_at=r[6],
        placed_at=r[7],
        status=HoldStatus(r[8]),
        posted_minor=int(r[9]),
        released_minor=int(r[10]),
        resolved_at=r[11],
        resolved_by=r[12],
        postings=tuple((str(p), int(a)) for p, a in r[13]),
        resized_minor=None if r[14] is None else int(r[14]),
    )


HOLDS_BY_ID = each_by_key("wallet_holds", "hold_id", _HOLD_COLUMNS)
# Locked in the ids' order: the callers sort them.
LOCK_HOLDS_BY_ID = each_by_key("wallet_holds", "hold_id", _HOLD_COLUMNS, lock=True)


async def holds(conn: psycopg.AsyncConnection, hold_ids: Iterable[str], *, lock: bool = False) -> dict[str, Hold]:
    ids = sorted(set(hold_ids))
    if not ids:
        return {}
    cur = await conn.execute(LOCK_HOLDS_BY_ID if lock else HOLDS_BY_ID, (ids,))
    return holds_from_rows(await cur.fetchall())


async def hold(conn: psycopg.AsyncConnection, hold_id: str, *, lock: bool = False) -> Hold | None:
    return (await holds(conn, [hold_id], lock=lock)).get(hold_id)


async def insert_holds(conn: psycopg.AsyncConnection, placed: Sequence[Hold]) -> None:
    """``insert_hold`` for several holds in one statement."""
    if not placed:
        return
    await conn.execute(
        "INSERT INTO wallet_holds (hold_id, account, amount_minor, reason, round_id, requested_expires_at_ms,"
        " expires_at, placed_at, status)"
        " SELECT * FROM unnest(%b::text[], %b::text[], %b::bigint[], %b::text[], %b::text[], %b::bigint[],"
        " %b::timestamptz[], %b::timestamptz[], %b::text[])",
        (
            [h.request.hold_id for h in placed],
            [h.request.account for h in placed],
            [h.request.amount_minor for h in placed],
            [h.request.reason for h in placed],
            [h.request.round_id for h in placed],
            [h.request.expires_at_unix_ms for h in placed],
            [h.expires_at for h in placed],
            [h.placed_at for h in placed],
            [h.status.value for h in placed],
        ),
    )


async def save_resolutions(conn: psycopg.AsyncConnection, resolved: Sequence[Hold]) -> None:
    """Record each hold's one resolution, in one statement; the ``status = 'open'`` guard makes a second
    one impossible."""
    if not resolved:
        return
    # Checked in the statement (``wallet_require``), so the write may be queued in a pipeline.
    await conn.execute(
        "WITH resolved AS ("
        " UPDATE wallet_holds h SET status = r.status, posted_minor = r.posted, released_minor = r.released,"
        " resolved_at = r.resolved_at, resolved_by = r.resolved_by, postings = r.postings::jsonb"
        " FROM unnest(%b::text[], %b::text[], %b::bigint[], %b::bigint[], %b::timestamptz[], %b::text[], %b::text[])"
        " AS r (hold_id, status, posted, released, resolved_at, resolved_by, postings)"
        " WHERE h.hold_id = r.hold_id AND h.status = 'open' RETURNING 1)"
        " SELECT wallet_require(count(*) = %s, (%s - count(*)) || ' of the holds were not open') FROM resolved",
        (
            [h.hold_id for h in resolved],
            [h.status.value for h in resolved],
            [h.posted_minor for h in resolved],
            [h.released_minor for h in resolved],
            [h.resolved_at for h in resolved],
            [h.resolved_by for h in resolved],
            [json.dumps([list(p) for p in h.postings]) for h in resolved],
            # Each hold once, and open until now (a hold named twice updates one row).
            len(resolved),
            len(resolved),
        ),
    )


async def save_resize(conn: psycopg.AsyncConnection, resized: Hold, resize: Resize) -> None:
    """Record the resize and the hold's new amount; the ``status = 'open'`` guard as in save_resolutions."""
    q = resize.request
    await conn.execute(
        "INSERT INTO wallet_hold_resizes (resize_id, hold_id, previous_minor, amount_minor, resized_at)"
        " VALUES (%s, %s, %s, %s, %s)",
        (q.resize_id, q.hold_id, resize.previous_minor, q.amount_minor, resize.resized_at),
    )
    cur = await conn.execute(
        "UPDATE wallet_holds SET resized_minor = %s WHERE hold_id = %s AND status = 'open'",
        (resized.resized_minor, resized.hold_id),
    )
    assert cur.rowcount == 1, f"hold {resized.hold_id} was not open"


async def hold_resize(conn: psycopg.AsyncConnection, resize_id: str) -> Resize | None:
    cur = await conn.execute(
        "SELECT resize_id, hold_id, amount_minor, previous_minor, resized_at FROM wallet_hold_resizes"
        " WHERE resize_id = %s",
        (resize_id,),
    )
    r = await cur.fetchone()
    return Resize(ResizeRequest(r[0], r[1], int(r[2])), int(r[3]), r[4]) if r else None


async def holds_page(
    conn: psycopg.AsyncConnection, name: str, include_resolved: bool, before_seq: int, limit: int
) -> list[tuple[int, Hold]]:
    status = "" if include_resolved else " AND status = 'open'"
    cur = await conn.execute(
        f"SELECT seq, {_HOLD_COLUMNS} FROM wallet_holds WHERE account = %s AND seq < %s{status}"
        " ORDER BY seq DESC LIMIT %s",
        (name, before_seq, limit),
    )
    return [(int(r[0]), _hold(r[1:])) for r in await cur.fetchall()]


async def due_holds(conn: psycopg.AsyncConnection, now: datetime, limit: int) -> list[tuple[str, str]]:
    """(hold id, account) of open holds past their time, oldest first."""
    cur = await conn.execute(
        "SELECT hold_id, account FROM wallet_holds WHERE status = 'open' AND expires_at <= %s"
        " ORDER BY expires_at LIMIT %s",
        (now, limit),
    )
    return [(r[0], r[1]) for r in await cur.fetchall()]


async def open_hold_stats(conn: psycopg.AsyncConnection) -> tuple[int, datetime | None]:
    cur = await conn.execute("SELECT count(*), min(placed_at) FROM wallet_holds WHERE status = 'open'")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), row[1]


@dataclass(frozen=True, slots=True)
class HoldContexts:
    """What PlaceHold decides on, for a group of holds: their accounts (locked), earlier holds of
    their ids, the accounts' settings and which of their rounds the wallet has settled."""

    accounts: dict[str, LockedAccount]
    existing: dict[str, Hold]
    limits: dict[str, dict[LimitKind, LimitSetting]]
    exclusions: dict[str, Exclusion]
    ended_rounds: frozenset[str]


async def hold_contexts(
    conn: psycopg.AsyncConnection, accounts: Iterable[str], hold_ids: Iterable[str], round_ids: Iterable[str]
) -> HoldContexts:
    """Lock the accounts (in name order) and read the rest PlaceHold needs: five statements, one
    round trip in pipeline mode, whatever the number of holds.

    The row locks come first; the reads after them (READ COMMITTED: each statement its own
    snapshot) see every hold and setting committed before the locks were granted.
    """
    names = sorted(set(accounts))
    locked = await conn.execute(LOCK_ACCOUNTS, (names,))
    held = await conn.execute(HOLDS_BY_ID, (sorted(set(hold_ids)),))
    limit_rows = await conn.execute(
        "SELECT account, kind, value, pending_value, pending_effective_at FROM wallet_limits WHERE account = ANY(%s)",
        (names,),
    )
    excluded = await conn.execute(
        "SELECT account, until, permanent FROM wallet_exclusions WHERE account = ANY(%s)", (names,)
    )
    ended = await conn.execute(
        "SELECT round_id FROM wallet_rounds WHERE round_id = ANY(%s) AND round_id <> ''"
        " AND status IN ('settled', 'voided')",
        (sorted(set(round_ids)),),
    )
    found = locked_from_rows(await locked.fetchall())
    existing = holds_from_rows(await held.fetchall())
    settings: dict[str, dict[LimitKind, LimitSetting]] = {}
    for r in await limit_rows.fetchall():
        kind = LimitKind(r[1])
        settings.setdefault(r[0], {})[kind] = LimitSetting(kind, int(r[2]), None if r[3] is None else int(r[3]), r[4])
    exclusions = {r[0]: Exclusion(r[1], bool(r[2])) for r in await excluded.fetchall()}
    ended_rounds = frozenset(str(r[0]) for r in await ended.fetchall())
    return HoldContexts(found, existing, settings, exclusions, ended_rounds)
