"""The wallet's responsible-play settings (``wallet_limits``, ``wallet_exclusions``) and the sums of an
account's entries over the money limits' windows."""

from __future__ import annotations

from datetime import datetime

import psycopg

from services.wallet.domain_play import Exclusion, LimitKind, LimitSetting


async def limits(conn: psycopg.AsyncConnection, name: str) -> dict[LimitKind, LimitSetting]:
    cur = await conn.execute(
        "SELECT kind, value, pending_value, pending_effective_at FROM wallet_limits WHERE account = %s", (name,)
    )
    return {
        LimitKind(r[0]): LimitSetting(LimitKind(r[0]), int(r[1]), None if r[2] is None else int(r[2]), r[3])
        for r in await cur.fetchall()
    }


async def save_limit(conn: psycopg.AsyncConnection, name: str, s: LimitSetting) -> None:
    await conn.execute(
        "INSERT INTO wallet_limits (account, kind, value, pending_value, pending_effective_at)"
        " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (account, kind) DO UPDATE SET value = EXCLUDED.value,"
        " pending_value = EXCLUDED.pending_value, pending_effective_at = EXCLUDED.pending_effective_at",
        (name, s.kind.value, s.value, s.pending_value, s.pending_effective_at),
    )


async def exclusion(conn: psycopg.AsyncConnection, name: str) -> Exclusion:
    cur = await conn.execute("SELECT until, permanent FROM wallet_exclusions WHERE account = %s", (name,))
    r = await cur.fetchone()
    return Exclusion(r[0], bool(r[1])) if r else Exclusion()


async def save_exclusion(conn: psycopg.AsyncConnection, name: str, e: Exclusion) -> None:
    await conn.execute(
        "INSERT INTO wallet_exclusions (account, until, permanent) VALUES (%s, %s, %s)"
        " ON CONFLICT (account) DO UPDATE SET until = EXCLUDED.until, permanent = EXCLUDED.permanent",
        (name, e.until, e.permanent),
    )


async def window_sums(conn: psycopg.AsyncConnection, name: str, now: datetime) -> dict[LimitKind, int]:
    """Deposits and net losses (posts and settlements) over each money limit's rolling window."""
    day, week = now - LimitKind.DAILY_LOSS.window, now - LimitKind.WEEKLY_LOSS.window
    cur = await conn.execute(
        "SELECT"
        " coalesce(sum(available_delta) FILTER (WHERE source = 'deposit' AND occurred_at > %(day)s), 0),"
        " coalesce(sum(available_delta) FILTER (WHERE source = 'deposit'), 0),"
        " coalesce(sum(available_delta + held_delta) FILTER (WHERE source <> 'deposit' AND occurred_at > %(day)s), 0),"
        " coalesce(sum(available_delta + held_delta) FILTER (WHERE source <> 'deposit'), 0)"
        " FROM wallet_entries WHERE account = %(account)s AND source IN ('deposit', 'post', 'settlement')"
        " AND occurred_at > %(week)s AND occurred_at <= %(now)s",
        {"account": name, "day": day, "week": week, "now": now},
    )
    row = await cur.fetchone()
    assert row is not None
    return {
        LimitKind.DAILY_DEPOSIT: int(row[0]),
        LimitKind.WEEKLY_DEPOSIT: int(row[1]),
        LimitKind.DAILY_LOSS: max(0, -int(row[2])),
        LimitKind.WEEKLY_LOSS: max(0, -int(row[3])),
    }
