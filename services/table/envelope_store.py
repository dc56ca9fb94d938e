"""The SQL of red-envelope rounds: the round's envelope row, its dealer bids and its grabs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from backbone.errors import NotFound
from services.table.core.state import Grab
from services.table.store import Conn, Row, TableStore


class EnvelopeStore:
    def __init__(self, store: TableStore) -> None:
        self._store = store

    async def _one(self, conn: Conn, query: str, params: Sequence[Any]) -> Row | None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            return await cur.fetchone()

    async def open(self, conn: Conn, round_id: str, table_id: str, bidding_closes: datetime, redeal_of: str) -> None:
        await conn.execute(
            "INSERT INTO envelope_rounds (round_id, table_id, bidding_closes_at, redeal_of) VALUES (%s, %s, %s, %s)",
            (round_id, table_id, bidding_closes, redeal_of or None),
        )

    async def row(self, conn: Conn, round_id: str, *, lock: bool = False) -> Row:
        row = await self._one(
            conn, "SELECT * FROM envelope_rounds WHERE round_id = %s" + (" FOR UPDATE" if lock else ""), (round_id,)
        )
        if row is None:
            raise NotFound("ROUND_NOT_FOUND", f"no red-envelope round {round_id}")
        return row

    async def bidding_closes_at(self, round_id: str) -> datetime | None:
        async with self._store.read() as conn:
            cur = await conn.execute("SELECT bidding_closes_at FROM envelope_rounds WHERE round_id = %s", (round_id,))
            row = await cur.fetchone()
        return row[0] if row else None

    async def is_redeal(self, round_id: str) -> bool:
        async with self._store.read() as conn:
            cur = await conn.execute("SELECT redeal FROM envelope_rounds WHERE round_id = %s", (round_id,))
            row = await cur.fetchone()
        return bool(row and row[0])

    async def mark_redeal(self, conn: Conn, round_id: str) -> None:
        """The round is voided to be re-dealt (in the void's transaction): the next round names it."""
        await conn.execute("UPDATE envelope_rounds SET redeal = true WHERE round_id = %s", (round_id,))

    # ------------------------------------------------------------------ bids

    async def bid(self, conn: Conn, bid_id: str) -> Row | None:
        return await self._one(
            conn,
            "SELECT b.*, r.table_id FROM envelope_bids b JOIN envelope_rounds r USING (round_id) WHERE bid_id = %s",
            (bid_id,),
        )

    async def outbid(self, conn: Conn, bid_id: str) -> str:
        """Mark the bid outbid; its hold."""
        cur = await conn.execute(
            "UPDATE envelope_bids SET status = 'outbid' WHERE bid_id = %s RETURNING hold_id", (bid_id,)
        )
        row = await cur.fetchone()
        return str(row[0]) if row else ""

    async def lead(self, conn: Conn, bid: Mapping[str, Any], at: datetime) -> None:
        """Record a bid as the round's leading one."""
        await conn.execute(
            "INSERT INTO envelope_bids (bid_id, round_id, player, amount_minor, hold_id, hold_minor, status,"
            " placed_at) VALUES (%s, %s, %s, %s, %s, %s, 'leading', %s)",
            (bid["bid_id"], bid["round_id"], bid["player"], bid["amount_minor"], bid["hold_id"], bid["hold_minor"], at),
        )
        await conn.execute(
            "UPDATE envelope_rounds SET leading_bid_id = %s, highest_bid_minor = %s WHERE round_id = %s",
            (bid["bid_id"], bid["amount_minor"], bid["round_id"]),
        )

    async def bid_count(self, conn: Conn, round_id: str) -> int:
        cur = await conn.execute("SELECT count(*) FROM envelope_bids WHERE round_id = %s", (round_id,))
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def seat_dealer(self, conn: Conn, round_id: str, leader: Mapping[str, Any]) -> None:
        await conn.execute("UPDATE envelope_bids SET status = 'won' WHERE bid_id = %s", (leader["bid_id"],))
        await conn.execute(
            "UPDATE envelope_rounds SET dealer = %s, dealer_pool_minor = %s, dealer_hold_id = %s,"
            " dealer_hold_minor = %s WHERE round_id = %s",
            (leader["player"], leader["amount_minor"], leader["hold_id"], leader["hold_minor"], round_id),
        )

    async def bid_holds(self, conn: Conn, round_id: str) -> list[str]:
        cur = await conn.execute(
            "SELECT hold_id FROM envelope_bids WHERE round_id = %s ORDER BY placed_at, bid_id", (round_id,)
        )
        return [str(r[0]) for r in await cur.fetchall()]

    # ------------------------------------------------------------------ grabs

    async def insert_grabs(self, conn: Conn, round_id: str, grabs: Sequence[Grab]) -> None:
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO envelope_grabs (round_id, grab_no, position, participant, bet_id, amount_minor)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                [(round_id, g.grab_no, g.position, g.participant, g.bet_id or None, g.amount_minor) for g in grabs],
            )

    async def grabs(self, conn: Conn, round_id: str) -> list[Grab]:
        cur = await conn.execute(
            "SELECT grab_no, position, participant, coalesce(bet_id, ''), amount_minor FROM envelope_grabs"
            " WHERE round_id = %s ORDER BY grab_no",
            (round_id,),
        )
        return [Grab(int(a), int(b), str(c), str(d), int(e)) for a, b, c, d, e in await cur.fetchall()]
