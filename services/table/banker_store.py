"""The SQL of the banker seat: the seat row, the queue, and each banked round's banker, hold and stakes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from services.table.store import Conn, TableStore

MAX_QUEUE_LISTED = 1_000


@dataclass(frozen=True, slots=True)
class RoundBanker:
    """Who banks a round, with what capital, under which hold; ``banker`` None when nobody does."""

    round_id: str
    table_id: str
    banker: str | None
    capital_minor: int
    hold_id: str
    hold_expires_at: datetime | None
    table_cap_minor: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RoundBanker:
        return cls(
            row["round_id"],
            row["table_id"],
            row["banker"],
            int(row["capital_minor"]),
            row["hold_id"] or "",
            row["hold_expires_at"],
            int(row["table_cap_minor"]),
        )


@dataclass(slots=True)
class Seat:
    player: str | None
    capital_minor: int
    rounds_banked: int
    leaving: bool


class BankerStore:
    def __init__(self, store: TableStore) -> None:
        self._store = store

    # ------------------------------------------------------------------ the seat and the queue

    async def lock_seat(self, conn: Conn, table_id: str) -> Seat:
        await conn.execute("INSERT INTO banker_seats (table_id) VALUES (%s) ON CONFLICT DO NOTHING", (table_id,))
        return await self.seat(conn, table_id, lock=True)

    async def seat(self, conn: Conn, table_id: str, *, lock: bool = False) -> Seat:
        cur = await conn.execute(
            "SELECT player, capital_minor, rounds_banked, leaving FROM banker_seats WHERE table_id = %s"
            + (" FOR UPDATE" if lock else ""),
            (table_id,),
        )
        row = await cur.fetchone()
        if row is None:
            return Seat(None, 0, 0, False)
        return Seat(row[0], int(row[1]), int(row[2]), bool(row[3]))

    async def save_seat(self, conn: Conn, table_id: str, seat: Seat) -> None:
        await conn.execute(
            "UPDATE banker_seats SET player = %s, capital_minor = %s, rounds_banked = %s, leaving = %s"
            " WHERE table_id = %s",
            (seat.player, seat.capital_minor, seat.rounds_banked, seat.leaving, table_id),
        )

    async def set_leaving(self, conn: Conn, table_id: str) -> None:
        await conn.execute("UPDATE banker_seats SET leaving = true WHERE table_id = %s", (table_id,))

    async def queued_capital(self, conn: Conn, table_id: str, player: str) -> int | None:
        cur = await conn.execute(
            "SELECT capital_minor FROM banker_queue WHERE table_id = %s AND player = %s", (table_id, player)
        )
        row = await cur.fetchone()
        return int(row[0]) if row else None

    async def enqueue(self, conn: Conn, table_id: str, player: str, capital_minor: int, at: datetime) -> None:
        await conn.execute(
            "INSERT INTO banker_queue (table_id, player, capital_minor, applied_at) VALUES (%s, %s, %s, %s)",
            (table_id, player, capital_minor, at),
        )

    async def dequeue(self, conn: Conn, table_id: str, player: str) -> bool:
        cur = await conn.execute("DELETE FROM banker_queue WHERE table_id = %s AND player = %s", (table_id, player))
        return cur.rowcount > 0

    async def pop_head(self, conn: Conn, table_id: str) -> tuple[str, int] | None:
        cur = await conn.execute(
            "DELETE FROM banker_queue WHERE (table_id, player) = (SELECT table_id, player FROM banker_queue"
            " WHERE table_id = %s ORDER BY seq LIMIT 1 FOR UPDATE) RETURNING player, capital_minor",
            (table_id,),
        )
        row = await cur.fetchone()
        return (str(row[0]), int(row[1])) if row else None

    async def queue(self, conn: Conn, table_id: str) -> list[tuple[str, int, datetime]]:
        cur = await conn.execute(
            "SELECT player, capital_minor, applied_at FROM banker_queue WHERE table_id = %s ORDER BY seq LIMIT %s",
            (table_id, MAX_QUEUE_LISTED),
        )
        return [(str(p), int(c), at) for p, c, at in await cur.fetchall()]

    # ------------------------------------------------------------------ banked rounds

    async def round_banker(self, conn: Conn, round_id: str) -> RoundBanker | None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT * FROM banked_rounds WHERE round_id = %s", (round_id,))
            row = await cur.fetchone()
        return RoundBanker.from_row(row) if row else None

    async def insert_round_banker(self, conn: Conn, plan: RoundBanker) -> None:
        await conn.execute(
            "INSERT INTO banked_rounds (round_id, table_id, banker, capital_minor, hold_id, hold_expires_at,"
            " table_cap_minor) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                plan.round_id,
                plan.table_id,
                plan.banker,
                plan.capital_minor,
                plan.hold_id or None,
                plan.hold_expires_at,
                plan.table_cap_minor,
            ),
        )

    async def drop_round_banker(self, conn: Conn, round_id: str, banker: str | None) -> None:
        await conn.execute("DELETE FROM banked_rounds WHERE round_id = %s AND banker = %s", (round_id, banker))

    async def previous_banked_round(self, table_id: str, round_no: int) -> str | None:
        """The table's round ``round_no`` if it was banked by a player and has ended."""
        async with self._store.read() as conn:
            cur = await conn.execute(
                "SELECT b.round_id FROM banked_rounds b JOIN rounds r USING (round_id) WHERE r.table_id = %s"
                " AND r.round_no = %s AND b.banker IS NOT NULL AND r.phase IN ('settled', 'voided')",
                (table_id, round_no),
            )
            row = await cur.fetchone()
        return str(row[0]) if row else None

    async def staked_minor(self, conn: Conn, round_id: str) -> int:
        cur = await conn.execute("SELECT staked_minor FROM banked_rounds WHERE round_id = %s", (round_id,))
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def count_stake(self, conn: Conn, round_id: str, player: str, amount: int) -> bool:
        """Count a stake against the round's table cap, atomically; False when it does not fit (or no banker)."""
        cur = await conn.execute(
            "UPDATE banked_rounds SET staked_minor = staked_minor + %s WHERE round_id = %s AND banker IS NOT NULL"
            " AND banker <> %s AND staked_minor + %s <= table_cap_minor RETURNING staked_minor",
            (amount, round_id, player, amount),
        )
        return await cur.fetchone() is not None

    async def release(self, conn: Conn, round_id: str, amount: int) -> None:
        await conn.execute(
            "UPDATE banked_rounds SET staked_minor = staked_minor - %s WHERE round_id = %s", (amount, round_id)
        )
