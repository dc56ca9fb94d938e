"""The table service's SQL for tables, rounds, bets and their events (the one place it is written).

Rows are the current state; every row change commits with the events that
announce it (``append``), in the caller's transaction. Red-envelope and banker
rows have stores of their own beside this one (``envelope_store.py``,
``banker_store.py``); the jackpot pool's claims live in ``jackpot.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from google.protobuf.message import Message
from niuniu.table.v1 import events_pb2 as ev
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from backbone.db import each_by_key, sent_together
from backbone.errors import NotFound, clip
from backbone.eventreads import read_correlated_many
from backbone.eventstore import ORDER_AFTER_LOCKS, EventStore, NewEvent, StoredEvent, ordering_domain

Conn = psycopg.AsyncConnection
Row = dict[str, Any]


BETS_BY_ID = each_by_key("bets", "bet_id", "r.*")


class BetQuery(NamedTuple):
    """A bet about to be placed: its table, the ids it may be stored under, its player."""

    table_id: str
    bet_ids: tuple[str, ...]
    player: str


class BetContext(NamedTuple):
    """What a bet is checked against: the bets stored under its ids, its table, the table's current
    round (None between rounds), the player's stakes in that round, their bets there (any status) and
    their open bets there."""

    stored: list[Row]
    table: Row | None
    current: Row | None
    staked: int
    player_bets: int
    player_open_bets: int


class Recorded(NamedTuple):
    """What recording a bet found: the round's phase and betting deadline (None: no such round), whether
    the bet was inserted, and the facts it was admitted against as they were before it: what the player
    had staked in the round, how many bets the round and the player in it had (any status), and the
    player's open bets there. Not inserted, the facts name the refusal (``admission.verify_bet``)."""

    window: tuple[str, datetime] | None
    inserted: bool
    staked: int
    round_bets: int
    player_bets: int
    player_open_bets: int


class TableStore:
    def __init__(self, pool: AsyncConnectionPool, events: EventStore) -> None:
        self.pool = pool
        self.events = events

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Conn]:
        async with self.pool.connection() as conn:
            yield conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Conn]:
        async with self.pool.connection() as conn, conn.transaction():
            yield conn

    async def append(
        self,
        conn: Conn,
        stream: str,
        event_type: str,
        payload: Message,
        *,
        correlation_id: str,
        causation_id: str = "",
        new_stream: bool = False,
    ) -> None:
        """Append one event; callers hold the lock that orders the stream's appends."""
        version = 0 if new_stream else await self.events.stream_version(conn, stream)
        event = NewEvent(event_type, payload, correlation_id=correlation_id, causation_id=causation_id)
        await self.events.append(conn, stream, version, [event])

    async def read_correlated(self, conn: Conn, correlation_id: str) -> list[StoredEvent]:
        return list(await self.events.read_correlated(conn, correlation_id))

    async def read_round_events(self, conn: Conn, round_id: str, stream: str) -> list[StoredEvent]:
        """The events of one round on one stream (the table's: not its bets'), in position order."""
        return await self.events.read_correlated(conn, round_id, stream)

    async def read_rounds_events(self, conn: Conn, round_ids: Sequence[str]) -> list[StoredEvent]:
        """The events of several rounds (correlated with their ids) in one read, in position order."""
        return await read_correlated_many(conn, round_ids)

    # ------------------------------------------------------------------ tables

    async def _one(self, conn: Conn, query: str, params: Sequence[Any]) -> Row | None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            return await cur.fetchone()

    async def _all(self, conn: Conn, query: str, params: Sequence[Any]) -> list[Row]:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            return list(await cur.fetchall())

    async def table(self, conn: Conn, table_id: str, *, lock: bool = False) -> Row:
        row = await self._one(
            conn, "SELECT * FROM tables WHERE table_id = %s" + (" FOR UPDATE" if lock else ""), (table_id,)
        )
        if row is None:
            raise NotFound("TABLE_NOT_FOUND", f"no table {clip(table_id)}")
        return row

    async def insert_table(
        self, conn: Conn, table_id: str, variant: str, settings: Mapping[str, str], limits: bytes
    ) -> bool:
        cur = await conn.execute(
            "INSERT INTO tables (table_id, variant, config, limits, config_version) VALUES (%s, %s, %s, %s, 1)"
            " ON CONFLICT (table_id) DO NOTHING",
            (table_id, variant, json.dumps(dict(settings)), limits),
        )
        return cur.rowcount == 1

    async def update_config(
        self, conn: Conn, table_id: str, settings: Mapping[str, str], limits: bytes, version: int
    ) -> None:
        await conn.execute(
            "UPDATE tables SET config = %s, limits = %s, config_version = %s WHERE table_id = %s",
            (json.dumps(dict(settings)), limits, version, table_id),
        )

    async def table_ids(self) -> list[str]:
        async with self.read() as conn:
            cur = await conn.execute("SELECT table_id FROM tables ORDER BY table_id")
            return [row[0] for row in await cur.fetchall()]

    async def variant_of_table(self, conn: Conn, table_id: str) -> str | None:
        cur = await conn.execute("SELECT variant FROM tables WHERE table_id = %s", (table_id,))
        row = await cur.fetchone()
        return str(row[0]) if row else None

    async def seat(self, conn: Conn, table_id: str, player: str, at: datetime) -> None:
        await conn.execute(
            "INSERT INTO seats (table_id, player, joined_at) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            (table_id, player, at),
        )

    async def unseat(self, conn: Conn, table_id: str, player: str) -> None:
        await conn.execute("DELETE FROM seats WHERE table_id = %s AND player = %s", (table_id, player))

    # ------------------------------------------------------------------ rounds

    async def round(self, conn: Conn, round_id: str, *, lock: bool = False) -> Row:
        row = await self._one(
            conn, "SELECT * FROM rounds WHERE round_id = %s" + (" FOR UPDATE" if lock else ""), (round_id,)
        )
        if row is None:
            raise NotFound("ROUND_NOT_FOUND", f"no round {clip(round_id)}")
        return row

    async def current_round(self, conn: Conn, table: Mapping[str, Any]) -> Row | None:
        return await self.round(conn, table["current_round_id"]) if table["current_round_id"] else None

    async def window(self, conn: Conn, round_id: str) -> tuple[str, datetime] | None:
        """(phase, betting deadline) under a share lock: the window cannot close while the caller writes."""
        cur = await conn.execute(
            "SELECT phase, betting_closes_at FROM rounds WHERE round_id = %s FOR SHARE", (round_id,)
        )
        row = await cur.fetchone()
        return (str(row[0]), row[1]) if row else None

    async def insert_round(self, conn: Conn, table: Mapping[str, Any], round_id: str, round_no: int, phase: str,
                           commitment: str, closes: datetime, fencing_token: int, now: datetime) -> None:  # fmt: skip
        await conn.execute(
            "INSERT INTO rounds (round_id, table_id, round_no, phase, commitment, config, limits, config_version,"
            " betting_closes_at, fencing_token, opened_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                round_id,
                table["table_id"],
                round_no,
                phase,
                commitment,
                json.dumps(table["config"]),
                table["limits"],
                table["config_version"],
                closes,
                fencing_token,
                now,
            ),
        )
        await conn.execute(
            "UPDATE tables SET round_no = %s, current_round_id = %s WHERE table_id = %s",
            (round_no, round_id, table["table_id"]),
        )

    async def set_phase(self, conn: Conn, round_id: str, phase: str) -> None:
        await conn.execute("UPDATE rounds SET phase = %s WHERE round_id = %s", (phase, round_id))

    async def open_betting(self, conn: Conn, round_id: str, closes: datetime) -> None:
        await conn.execute(
            "UPDATE rounds SET phase = 'betting', betting_closes_at = %s WHERE round_id = %s", (closes, round_id)
        )

    async def set_client_seed(self, conn: Conn, round_id: str, client_seed: str) -> None:
        """The round's client seed, combined from its bets' contributions when betting closed."""
        await conn.execute("UPDATE rounds SET client_seed = %s WHERE round_id = %s", (client_seed, round_id))

    async def dealt(self, conn: Conn, round_id: str, phase: str, deck: Sequence[str] | None, next_at: datetime) -> None:
        await conn.execute(
            "UPDATE rounds SET phase = %s, deck = coalesce(%s, deck), next_step_at = %s WHERE round_id = %s",
            (phase, list(deck) if deck is not None else None, next_at, round_id),
        )

    async def revealed(self, conn: Conn, round_id: str, done: int, phase: str, next_at: datetime) -> None:
        await conn.execute(
            "UPDATE rounds SET reveals_done = %s, phase = %s, next_step_at = %s WHERE round_id = %s",
            (done, phase, next_at, round_id),
        )

    async def end_round(self, conn: Conn, round_id: str, phase: str, at: datetime, reason: str | None = None) -> None:
        await conn.execute(
            "UPDATE rounds SET phase = %s, void_reason = %s, ended_at = %s WHERE round_id = %s",
            (phase, reason, at, round_id),
        )

    async def unrevealed_seeds(self, table_id: str, phases: Sequence[str], skip: str, limit: int) -> list[Row]:
        async with self.read() as conn:
            return await self._all(
                conn,
                "SELECT * FROM rounds WHERE table_id = %s AND phase = ANY(%s) AND server_seed IS NULL"
                " AND round_id <> %s ORDER BY round_no LIMIT %s",
                (table_id, list(phases), skip, limit),
            )

    async def set_seed(self, conn: Conn, round_id: str, server_seed: str) -> None:
        await conn.execute("UPDATE rounds SET server_seed = %s WHERE round_id = %s", (server_seed, round_id))

    async def recent_rounds(self, table_id: str, limit: int) -> list[Row]:
        async with self.read() as conn:
            return await self._all(
                conn, "SELECT * FROM rounds WHERE table_id = %s ORDER BY round_no DESC LIMIT %s", (table_id, limit)
            )

    # ------------------------------------------------------------------ bets

    async def bet(self, conn: Conn, bet_id: str, *, lock: bool = False) -> Row | None:
        return await self._one(
            conn, "SELECT * FROM bets WHERE bet_id = %s" + (" FOR UPDATE" if lock else ""), (bet_id,)
        )

    async def round_bets(self, conn: Conn, round_id: str) -> list[Row]:
        return await self._all(conn, "SELECT * FROM bets WHERE round_id = %s ORDER BY placed_at, bet_id", (round_id,))

    async def open_bet_ids(self, conn: Conn, round_id: str, player: str) -> list[str]:
        cur = await conn.execute(
            "SELECT bet_id FROM bets WHERE round_id = %s AND player = %s AND status = 'placed' ORDER BY placed_at",
            (round_id, player),
        )
        return [str(row[0]) for row in await cur.fetchall()]

    async def staked_minor(self, conn: Conn, round_id: str, player: str, excluding: str = "") -> int:
        cur = await conn.execute(
            "SELECT coalesce(sum(stake_minor), 0) FROM bets WHERE round_id = %s AND player = %s AND status = 'placed'"
            " AND bet_id <> %s",
            (round_id, player, excluding),
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def betting_totals(self, conn: Conn, round_id: str) -> tuple[int, int]:
        """(open bets, their total stake) of the round."""
        cur = await conn.execute(
            "SELECT count(*), coalesce(sum(stake_minor), 0) FROM bets WHERE round_id = %s AND status = 'placed'",
            (round_id,),
        )
        row = await cur.fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    async def bet_contexts(self, conn: Conn, queries: Sequence[BetQuery]) -> list[BetContext]:
        """What PlaceBet checks before the wallet's hold, for several bets in one round trip (``sent_together``)
        of four statements whatever their number: for each bet, the bets stored under any of its ids, its
        table, the table's current round (with ``bets_taken``: its bets of any status) and the player's
        staked sum there."""
        table_ids = sorted({q.table_id for q in queries})
        async with sent_together(conn):
            bets = conn.cursor(row_factory=dict_row)
            tables = conn.cursor(row_factory=dict_row)
            rounds = conn.cursor(row_factory=dict_row)
            staked = conn.cursor()
            await bets.execute(BETS_BY_ID, (sorted({i for q in queries for i in q.bet_ids}),))
            await tables.execute("SELECT * FROM tables WHERE table_id = ANY(%s)", (table_ids,))
            await rounds.execute(
                "SELECT r.*, coalesce(c.bets, 0) AS bets_taken FROM tables t"
                " JOIN rounds r ON r.round_id = t.current_round_id LEFT JOIN round_bet_counts c USING (round_id)"
                " WHERE t.table_id = ANY(%s)",
                (table_ids,),
            )
            # LATERAL: each (round, player) sum is an index lookup on both columns. As a join the planner
            # matched the round alone through the index and filtered the player out of the round's bets.
            await staked.execute(
                "SELECT q.n, s.minor, s.bets, s.open"
                " FROM unnest(%b::text[], %b::text[]) WITH ORDINALITY AS q (table_id, player, n)"
                " JOIN tables t ON t.table_id = q.table_id"
                " CROSS JOIN LATERAL (SELECT coalesce(sum(b.stake_minor) FILTER (WHERE b.status = 'placed'), 0)"
                "  AS minor, count(*) AS bets, count(*) FILTER (WHERE b.status = 'placed') AS open FROM bets b"
                "  WHERE b.round_id = t.current_round_id AND b.player = q.player) s",
                ([q.table_id for q in queries], [q.player for q in queries]),
            )
        # Read after the block: its one Sync brought every result.
        sums = {int(n) - 1: (int(total), int(count), int(open_)) for n, total, count, open_ in await staked.fetchall()}
        by_bet_id = {row["bet_id"]: row for row in await bets.fetchall()}
        by_table = {row["table_id"]: row for row in await tables.fetchall()}
        current = {row["table_id"]: row for row in await rounds.fetchall()}
        return [
            BetContext(
                [by_bet_id[i] for i in dict.fromkeys(q.bet_ids) if i in by_bet_id],
                by_table.get(q.table_id),
                current.get(q.table_id),
                *sums.get(n, (0, 0, 0)),
            )
            for n, q in enumerate(queries)
        ]

    async def lock_for_recording(self, conn: Conn, round_ids: Sequence[str], stream_id: str) -> None:
        """Before recording bets on ``round_ids`` (of one table) to the streams of ``stream_id``'s ordering
        domain: share-lock the rounds' rows in round id order, then take the domain's append locks
        (``ORDER_AFTER_LOCKS``), in that order, as each bet's statement takes them and a round's own writers
        do (row, then lock). Statements after this one see every bet of the table committed before."""
        await conn.execute(
            f"SELECT {ORDER_AFTER_LOCKS} FROM (SELECT count(*) FROM"
            " (SELECT 1 FROM rounds WHERE round_id = ANY(%(rounds)s) ORDER BY round_id FOR SHARE) r) rows_first",
            {"rounds": sorted(set(round_ids)), "domain": ordering_domain(stream_id)},
        )

    async def record_bet(
        self,
        conn: Conn,
        bet: Mapping[str, Any],
        now: datetime,
        client_seed: str,
        append: tuple[str, dict[str, object]],
        max_staked_minor: int,
        max_round_bets: int,
        max_player_bets: int,
    ) -> psycopg.AsyncCursor[Any]:
        """One statement: the round's window under a share lock; when it is open, the player's stakes in
        the round with this one stay within ``max_staked_minor``, the round has fewer than ``max_round_bets``
        bets and the player fewer than ``max_player_bets`` there, the bet and (only if the bet was inserted)
        its event through ``append`` (``EventStore.append_call``). Nothing is written when the window is
        closed, the room is not there, the round or the player's share of it is full, or the bet id (or the
        round's one bet of a player, where that holds: a unique index) is taken, so the caller may queue its
        COMMIT before it reads the outcome with ``bet_recorded``.

        The guard is ``admission.verify_bet``'s atomic form; it returns the facts it decided on, not a verdict.

        The stakes and bets counted are those committed before the statement began, and the caller's own:
        it holds the round's row and the table's ordering lock from an earlier statement
        (``lock_for_recording``), so none of the other bets at the table can be committing meanwhile. The
        round's count (``round_bet_counts``) is written by this statement alone, under that lock.
        """
        call, append_params = append
        return await conn.execute(
            "WITH w AS (SELECT phase, betting_closes_at FROM rounds WHERE round_id = %(round_id)s FOR SHARE),"
            " staked AS (SELECT coalesce(sum(stake_minor) FILTER (WHERE status = 'placed'), 0) AS minor,"
            "  count(*) AS bets, count(*) FILTER (WHERE status = 'placed') AS open"
            "  FROM bets WHERE round_id = %(round_id)s AND player = %(player)s),"
            # A round without its count yet: its first bet, or a round begun before the count was kept.
            " placed AS (SELECT coalesce((SELECT bets FROM round_bet_counts WHERE round_id = %(round_id)s),"
            "  (SELECT count(*) FROM bets WHERE round_id = %(round_id)s)) AS n),"
            " ins AS (INSERT INTO bets (bet_id, round_id, table_id, player, area, stake_minor, hold_minor, hold_id,"
            "  status, placed_at, client_seed)"
            "  SELECT %(bet_id)s, %(round_id)s, %(table_id)s, %(player)s, %(area)s, %(stake_minor)s, %(hold_minor)s,"
            "  %(hold_id)s, 'placed', %(now)s, %(client_seed)s"
            "  FROM w, staked, placed WHERE w.phase = 'betting' AND %(now)s < w.betting_closes_at"
            "  AND staked.minor + %(stake_minor)s <= %(max_staked)s AND placed.n < %(max_round_bets)s"
            "  AND staked.bets < %(max_player_bets)s"
            "  ON CONFLICT DO NOTHING RETURNING 1),"
            " i AS (SELECT count(*) AS n FROM ins),"
            " counted AS (INSERT INTO round_bet_counts (round_id, bets) SELECT %(round_id)s, placed.n + 1"
            "  FROM placed, i WHERE i.n > 0 ON CONFLICT (round_id) DO UPDATE SET bets = EXCLUDED.bets)"
            " SELECT w.phase, w.betting_closes_at, i.n > 0, staked.minor, CASE WHEN i.n > 0 THEN " + call + " END,"
            " placed.n, staked.bets, staked.open FROM i CROSS JOIN staked CROSS JOIN placed LEFT JOIN w ON true",
            {
                **{k: bet[k] for k in ("bet_id", "round_id", "table_id", "player", "area", "stake_minor")},
                "hold_minor": bet["hold_minor"],
                "hold_id": bet["hold_id"],
                "now": now,
                "client_seed": client_seed,
                "max_staked": max_staked_minor,
                "max_round_bets": max_round_bets,
                "max_player_bets": max_player_bets,
                **append_params,
            },
        )

    @staticmethod
    async def bet_recorded(cur: psycopg.AsyncCursor[Any]) -> Recorded:
        """``record_bet``'s outcome."""
        row = await cur.fetchone()
        assert row is not None
        window = (str(row[0]), row[1]) if row[0] is not None else None
        return Recorded(window, bool(row[2]), int(row[3]), int(row[5]), int(row[6]), int(row[7]))

    async def cancel_bet(self, conn: Conn, bet_id: str) -> None:
        await conn.execute("UPDATE bets SET status = 'cancelled' WHERE bet_id = %s", (bet_id,))

    async def restake(self, conn: Conn, bet_id: str, stake_minor: int, hold_minor: int) -> None:
        await conn.execute(
            "UPDATE bets SET stake_minor = %s, hold_minor = %s WHERE bet_id = %s", (stake_minor, hold_minor, bet_id)
        )

    async def change(self, conn: Conn, change_id: str) -> Row | None:
        return await self._one(conn, "SELECT * FROM bet_changes WHERE change_id = %s", (change_id,))

    async def insert_change(self, conn: Conn, change_id: str, bet_id: str, stake_minor: int, at: datetime) -> None:
        await conn.execute(
            "INSERT INTO bet_changes (change_id, bet_id, stake_minor, changed_at) VALUES (%s, %s, %s, %s)",
            (change_id, bet_id, stake_minor, at),
        )

    async def refund_bets(self, conn: Conn, round_id: str) -> None:
        await conn.execute(
            "UPDATE bets SET status = 'refunded', outcome = 'refund', net_minor = 0"
            " WHERE round_id = %s AND status = 'placed'",
            (round_id,),
        )

    async def save_outcomes(self, conn: Conn, results: Sequence[ev.BetOutcome]) -> None:
        """The settled bets' outcomes, in one statement whatever their number."""
        if not results:
            return
        await conn.execute(
            "UPDATE bets b SET status = 'settled', outcome = r.outcome, net_minor = r.net_minor"
            " FROM unnest(%b::text[], %b::text[], %b::bigint[]) AS r (bet_id, outcome, net_minor)"
            " WHERE b.bet_id = r.bet_id",
            ([r.bet_id for r in results], [str(r.outcome) for r in results], [r.net_minor for r in results]),
        )

    async def refund_bet_ids(self, conn: Conn, bet_ids: Sequence[str]) -> None:
        """Refund bets a settlement leaves out (their holds do not cover them: ``coverage.py``)."""
        if not bet_ids:
            return
        await conn.execute(
            "UPDATE bets SET status = 'refunded', outcome = 'refund', net_minor = 0"
            " WHERE bet_id = ANY(%s) AND status = 'placed'",
            (list(bet_ids),),
        )

    async def refund_settled_round(self, conn: Conn, round_id: str) -> None:
        """Refund every bet of a settled round an operator voids (its settlement was never applied)."""
        await conn.execute(
            "UPDATE bets SET status = 'refunded', outcome = 'refund', net_minor = 0"
            " WHERE round_id = %s AND status IN ('placed', 'settled')",
            (round_id,),
        )
