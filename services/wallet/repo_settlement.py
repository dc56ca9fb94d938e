"""The wallet's record of each round's settlement (``wallet_rounds``) and what applying one locks and
reads: its accounts, its holds and the round's other open holds."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg

from services.wallet.domain_holds import Hold
from services.wallet.repo import LOCK_ACCOUNTS, LockedAccount, locked_from_rows
from services.wallet.repo_holds import HOLDS_BY_ID, LOCK_HOLDS_BY_ID, holds_from_rows


@dataclass(frozen=True, slots=True)
class RoundRecord:
    round_id: str
    table_id: str
    status: str
    version: int
    digest: str
    reason: str
    detail: str
    updated_at: datetime


async def round_record(conn: psycopg.AsyncConnection, round_id: str, *, lock: bool = False) -> RoundRecord | None:
    suffix = " FOR UPDATE" if lock else ""
    cur = await conn.execute(
        "SELECT round_id, table_id, status, version, digest, reason, detail, updated_at FROM wallet_rounds"
        f" WHERE round_id = %s{suffix}",
        (round_id,),
    )
    r = await cur.fetchone()
    return RoundRecord(r[0], r[1], r[2], int(r[3]), r[4], r[5], r[6], r[7]) if r else None


async def save_round(conn: psycopg.AsyncConnection, r: RoundRecord) -> None:
    await conn.execute(
        "INSERT INTO wallet_rounds (round_id, table_id, status, version, digest, reason, detail, updated_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (round_id) DO UPDATE SET"
        " table_id = EXCLUDED.table_id, status = EXCLUDED.status, version = EXCLUDED.version,"
        " digest = EXCLUDED.digest, reason = EXCLUDED.reason, detail = EXCLUDED.detail,"
        " updated_at = EXCLUDED.updated_at",
        (r.round_id, r.table_id, r.status, r.version, r.digest, r.reason, r.detail, r.updated_at),
    )


async def rejected_round_count(conn: psycopg.AsyncConnection) -> int:
    """Rounds still rejected: an operator's repair (a void) or a re-sent settlement takes a round out."""
    cur = await conn.execute("SELECT count(*) FROM wallet_rounds WHERE status = 'rejected'")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


# (hold id, account) of the round's open holds that are not among the hold ids given.
_OPEN_HOLDS_OF_ROUND = (
    "SELECT hold_id, account FROM wallet_holds WHERE status = 'open' AND round_id = %s"
    " AND NOT (hold_id = ANY(%b::text[])) ORDER BY hold_id"
)


async def settlement_holds(
    conn: psycopg.AsyncConnection, round_id: str, hold_ids: Sequence[str]
) -> tuple[dict[str, Hold], list[tuple[str, str]]]:
    """A settlement's holds and (hold id, account) of its round's other open holds, in one round trip."""
    ids = sorted(set(hold_ids))
    async with conn.pipeline():
        named = await conn.execute(HOLDS_BY_ID, (ids,))
        others = await conn.execute(_OPEN_HOLDS_OF_ROUND, (round_id, ids))
    return (
        holds_from_rows(await named.fetchall()),
        [(r[0], r[1]) for r in await others.fetchall()],
    )


@dataclass(frozen=True, slots=True)
class SettlementLocks:
    accounts: dict[str, LockedAccount]
    holds: dict[str, Hold]
    strays: list[tuple[str, str]]  # (hold id, account) of the round's open holds the settlement does not name


async def lock_for_settlement(
    conn: psycopg.AsyncConnection, round_id: str, accounts: Iterable[str], hold_ids: Sequence[str]
) -> SettlementLocks:
    """Lock the accounts, then the holds (the usual order), and read the round's other open holds
    after both locks: one round trip."""
    ids = sorted(set(hold_ids))
    async with conn.pipeline():
        locked = await conn.execute(LOCK_ACCOUNTS, (sorted(set(accounts)),))
        held = await conn.execute(LOCK_HOLDS_BY_ID, (ids,))
        others = await conn.execute(_OPEN_HOLDS_OF_ROUND, (round_id, ids))
    return SettlementLocks(
        locked_from_rows(await locked.fetchall()),
        holds_from_rows(await held.fetchall()),
        [(r[0], r[1]) for r in await others.fetchall()],
    )
