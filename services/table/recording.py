"""The trips to the database that bets placed at the same moment share (``BetGroups``).

Bets placed at the same moment, at any tables, share the trips to the database
(``Grouped``): one read of four statements for all their checks, and, where the round
shape counts nothing in the bet's transaction, one recording transaction of one
statement per bet with one COMMIT (group commit). Each bet's outcome is its own
(recorded, or the facts it was refused on), as alone; the tables' ordering locks are taken
in table order, so two groups never wait on each other in a cycle; a group that fails is
worked on again bet by bet. Within a table a group records its bets in the order they
arrived.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from niuniu.table.v1 import events_pb2 as ev

from backbone.db import sent_together
from backbone.errors import Unavailable
from backbone.eventstore import NewEvent
from backbone.grouping import Grouped
from services.table.admission import Bounds
from services.table.common import BET_GROUP_SIZE, bet_stream
from services.table.round_base import RoundMachine
from services.table.store import BetContext, BetQuery, Recorded, TableStore

MAX_BET_GROUP = 64
"""Bound on the bets recorded in one transaction."""
BET_GROUPS_IN_FLIGHT = 2
"""Groups of bets being recorded at once, each on a connection of its own."""
MAX_BETS_WAITING = 1024
"""Bound on bets waiting for a group; one more is refused UNAVAILABLE TABLE_BUSY (its hold released)."""


class RecordingBusy(Unavailable):
    """Too many bets waiting to be recorded: this one was not, and its hold is released."""


@dataclass(frozen=True)
class Recording:
    """A bet to record, with the instant its window is checked against, the player's seed, the bounds it
    is admitted under (the table maximum among them) and its place in the order the bets arrived
    (``arrival``: a group records a table's bets in that order)."""

    bet: dict[str, Any]
    now: datetime
    client_seed: str
    bounds: Bounds
    arrival: int = 0


class BetGroups:
    """A bet's read before its hold and its recording after, each grouped with the other bets' at the
    same moment."""

    def __init__(self, store: TableStore) -> None:
        self._store = store
        self._recordings: Grouped[Recording, Recorded] = Grouped(
            self.record_group,
            keys=lambda r: (r.bet["bet_id"],),
            busy=lambda: RecordingBusy("TABLE_BUSY", "too many bets waiting to be recorded; retry shortly"),
            max_group=MAX_BET_GROUP,
            max_in_flight=BET_GROUPS_IN_FLIGHT,
            max_waiting=MAX_BETS_WAITING,
            on_group=BET_GROUP_SIZE.observe,
        )
        self._contexts: Grouped[BetQuery, BetContext] = Grouped(
            self._read_group,
            keys=lambda q: (),  # reads: any of them go together
            busy=lambda: Unavailable("TABLE_BUSY", "too many bets waiting to be checked; retry shortly"),
            max_group=MAX_BET_GROUP,
            max_in_flight=BET_GROUPS_IN_FLIGHT,
            max_waiting=MAX_BETS_WAITING,
        )

    async def context(self, query: BetQuery) -> BetContext:
        """The bet (under either id), its table, its round and the player's stakes there, in one round
        trip shared with the bets being placed at the same moment (``_read_group``)."""
        return await self._contexts(query)

    async def record(self, recording: Recording, machine: RoundMachine) -> Recorded:
        """The bet and its event: one statement that re-checks the window under a share lock on the round
        row and the player's room under the table maximum, inserts the bet and appends BetPlaced only if it
        inserted it (``TableStore.record_bet``), after an earlier statement of its transaction took the
        table's ordering lock (so the room counts every bet of the player's recorded before it).

        Where the shape counts stakes in the bet's transaction (``reserve``: a banker's table cap) the bet
        has a transaction of its own; otherwise it goes with the bets recorded at the same moment
        (``record_group``), its COMMIT queued behind the statements (pipeline mode): the tables' ordering
        locks are then held for no client round trip at all.
        """
        if not machine.reserves_stakes:
            return await self._recordings(recording)
        return await self._record_reserving(recording, machine)

    def append_placed(self, bet: Mapping[str, Any]) -> tuple[str, dict[str, object]]:
        """The strict append of the bet's BetPlaced to its new stream, for ``TableStore.record_bet``."""
        placed = ev.BetPlaced(**bet)
        event = NewEvent("table.bet_placed", placed, correlation_id=bet["round_id"], causation_id=bet["bet_id"])
        return self._store.events.append_call(bet_stream(bet["table_id"], bet["bet_id"]), 0, [event])

    async def _record_reserving(self, r: Recording, machine: RoundMachine) -> Recorded:
        """One bet and the shape's count of its stake (``reserve``), in a transaction of its own."""
        bet = r.bet
        append = self.append_placed(bet)
        async with self._store.pool.connection() as conn, sent_together(conn):
            await self._store.lock_for_recording(conn, [bet["round_id"]], bet_stream(bet["table_id"], bet["bet_id"]))
            cursor = await self._store.record_bet(conn, bet, r.now, r.client_seed, append, *_limits(r.bounds))
            recorded = await self._store.bet_recorded(cursor)
            if recorded.inserted:
                await machine.reserve(conn, bet["round_id"], bet["player"], bet["stake_minor"], bet["hold_id"])
        return recorded

    async def _read_group(self, queries: list[BetQuery]) -> list[BetContext]:
        async with self._store.read() as conn:
            return await self._store.bet_contexts(conn, queries)

    async def record_group(self, recordings: Sequence[Recording]) -> list[Recorded]:
        """Bets of any tables in one transaction: first, table by table in table order (the same for every
        group), the rows of the rounds bet on and the table's ordering lock (the order each bet's statement
        takes them in, and a round's own writers: row, then lock), then one statement per bet, a table's
        in the order they arrived (the table maximum counts the earlier ones first), the COMMIT queued with
        them: one sync."""

        def place_in_order(i: int) -> tuple[str, int]:
            return recordings[i].bet["table_id"], recordings[i].arrival

        order = sorted(range(len(recordings)), key=place_in_order)
        async with self._store.pool.connection() as conn:
            async with sent_together(conn):
                for _, at_table in itertools.groupby(order, key=lambda i: recordings[i].bet["table_id"]):
                    bets = [recordings[i].bet for i in at_table]
                    stream = bet_stream(bets[0]["table_id"], bets[0]["bet_id"])
                    await self._store.lock_for_recording(conn, [b["round_id"] for b in bets], stream)
                cursors = {}
                for i in order:
                    r = recordings[i]
                    append = self.append_placed(r.bet)
                    cursors[i] = await self._store.record_bet(
                        conn, r.bet, r.now, r.client_seed, append, *_limits(r.bounds)
                    )
            return [await self._store.bet_recorded(cursors[i]) for i in range(len(recordings))]


def _limits(bounds: Bounds) -> tuple[int, int, int]:
    """``record_bet``'s bounds, in its order."""
    return bounds.max_staked_minor, bounds.max_round_bets, bounds.max_player_bets
