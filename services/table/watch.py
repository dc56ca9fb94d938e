"""Live table updates for frontends, redacted for the watcher.

A watcher reads the table's events from the service's own event store (its
stream and its bets' streams) after a position, and turns each into the update
this watcher may see: everyone sees phases, area totals, revealed hands and area
results; only the bettor sees their own bets and amounts. No event of the table
carries a card before its reveal, so no update can. Redis pub/sub wakes watchers
when a table moves; without it they poll, so Redis stays a convenience.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from backbone.auth import Principal
from backbone.eventstore import StoredEvent, stored_event
from services.table.common import player_account, table_stream

log = logging.getLogger(__name__)

POLL_FALLBACK_S = 1.0
READ_BATCH = 500
CHANNEL_PREFIX = "niuniu:table-events:"


class Notifier:
    """One Redis subscription per process; wakes every watcher of a table when it moves."""

    def __init__(self, redis: Redis, prefix: str = "") -> None:
        self._redis = redis
        self._prefix = f"{CHANNEL_PREFIX}{prefix}"
        self._events: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self._sending: set[asyncio.Task[None]] = set()

    def publish(self, table_id: str) -> None:
        async def send() -> None:
            # A lost wake-up only delays watchers until their next poll.
            with contextlib.suppress(Exception):
                await self._redis.publish(self._prefix + table_id, "1")

        task = asyncio.get_running_loop().create_task(send())
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def wait(self, table_id: str, timeout_s: float) -> None:
        event = self._events[table_id]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                async with self._redis.pubsub() as pubsub:
                    await pubsub.psubscribe(self._prefix + "*")
                    while not stop.is_set():
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
                        if message is None:
                            continue
                        channel = message["channel"]
                        name = channel.decode() if isinstance(channel, bytes) else str(channel)
                        table_id = name.removeprefix(self._prefix)
                        event = self._events.pop(table_id, None)
                        if event is not None:
                            event.set()
            except Exception:
                log.warning("table notifier lost Redis; watchers fall back to polling", exc_info=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)


async def read_table_events(pool: AsyncConnectionPool, table_id: str, after: int, limit: int) -> list[StoredEvent]:
    stream = table_stream(table_id)
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT position, envelope FROM events WHERE (stream_id = %s OR stream_id LIKE %s) AND position > %s"
            " ORDER BY position LIMIT %s",
            (stream, stream.replace("_", r"\_") + ".%", after, limit),
        )
        rows = await cur.fetchall()
    return [stored_event(row) for row in rows]


async def current_round_start(pool: AsyncConnectionPool, table_id: str) -> int:
    """The position just before the current round's opening (0 if no round yet)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT max(position) FROM events WHERE stream_id = %s AND event_type = 'table.round_opened'",
            (table_stream(table_id),),
        )
        row = await cur.fetchone()
    return int(row[0]) - 1 if row and row[0] else 0


class WatchState:
    """Folds the table's events into what one watcher may see."""

    def __init__(self, watcher: Principal, table_id: str) -> None:
        self.watcher = player_account(watcher)
        self.table_id = table_id
        self.totals: dict[str, int] = defaultdict(int)
        self.bets = 0
        self.stakes: dict[str, tuple[str, int]] = {}

    def updates(self, event: StoredEvent) -> list[table_pb2.TableUpdate]:
        kind = event.event_type
        handler = getattr(self, "_" + kind.removeprefix("table."), None)
        if handler is None:
            return []
        made: list[table_pb2.TableUpdate] = []
        for fields in handler(event):
            update = table_pb2.TableUpdate(
                position=event.position, table_id=self.table_id, round_id=event.envelope.correlation_id, **fields
            )
            made.append(update)
        return made

    def _round_opened(self, event: StoredEvent) -> list[dict[str, Any]]:
        opened = ev.RoundOpened()
        event.unpack(opened)
        self.totals.clear()
        self.stakes.clear()
        self.bets = 0
        return [{"round_opened": opened}]

    def _bet_placed(self, event: StoredEvent) -> list[dict[str, Any]]:
        placed = ev.BetPlaced()
        event.unpack(placed)
        self.totals[placed.area] += placed.stake_minor
        self.stakes[placed.bet_id] = (placed.area, placed.stake_minor)
        self.bets += 1
        made: list[dict[str, Any]] = []
        if placed.player == self.watcher:
            made.append({"my_bet_placed": placed})
        made.append({"area_totals": table_pb2.AreaTotals(totals_minor=self.totals, bets=self.bets)})
        return made

    def _bet_cancelled(self, event: StoredEvent) -> list[dict[str, Any]]:
        cancelled = ev.BetCancelled()
        event.unpack(cancelled)
        area, stake = self.stakes.pop(cancelled.bet_id, ("", 0))
        if area:
            self.totals[area] -= stake
            self.bets -= 1
        made: list[dict[str, Any]] = []
        if cancelled.player == self.watcher:
            made.append({"my_bet_cancelled": cancelled})
        made.append({"area_totals": table_pb2.AreaTotals(totals_minor=self.totals, bets=self.bets)})
        return made

    def _bet_changed(self, event: StoredEvent) -> list[dict[str, Any]]:
        changed = ev.BetChanged()
        event.unpack(changed)
        area, stake = self.stakes.get(changed.bet_id, (changed.area, changed.previous_stake_minor))
        self.totals[area] += changed.stake_minor - stake
        self.stakes[changed.bet_id] = (area, changed.stake_minor)
        made: list[dict[str, Any]] = []
        if changed.player == self.watcher:
            made.append({"my_bet_changed": changed})
        made.append({"area_totals": table_pb2.AreaTotals(totals_minor=self.totals, bets=self.bets)})
        return made

    def _bid_placed(self, event: StoredEvent) -> list[dict[str, Any]]:
        bid = ev.BidPlaced()
        event.unpack(bid)  # bids are public: everyone sees the amount to beat
        return [{"bid_placed": bid}]

    def _dealer_chosen(self, event: StoredEvent) -> list[dict[str, Any]]:
        chosen = ev.DealerChosen()
        event.unpack(chosen)
        phase = table_pb2.PhaseChanged(phase="betting", deadline_unix_ms=chosen.betting_closes_at_unix_ms)
        return [{"phase_changed": phase}, {"dealer_chosen": chosen}]

    def _envelope_sent(self, event: StoredEvent) -> list[dict[str, Any]]:
        sent = ev.EnvelopeSent()
        event.unpack(sent)  # who takes part and the total; each amount only in its grab
        return [{"phase_changed": table_pb2.PhaseChanged(phase="revealing")}, {"envelope_sent": sent}]

    def _envelope_grabbed(self, event: StoredEvent) -> list[dict[str, Any]]:
        grabbed = ev.EnvelopeGrabbed()
        event.unpack(grabbed)
        return [{"envelope_grabbed": grabbed}]

    def _betting_closed(self, event: StoredEvent) -> list[dict[str, Any]]:
        return [{"phase_changed": table_pb2.PhaseChanged(phase="dealing")}]

    def _dealt(self, event: StoredEvent) -> list[dict[str, Any]]:
        dealt = ev.Dealt()
        event.unpack(dealt)  # public facts only: no hand's card (百變牛牛's drawn card is shown and burned)
        return [{"phase_changed": table_pb2.PhaseChanged(phase="revealing")}, {"dealt": dealt}]

    def _hand_revealed(self, event: StoredEvent) -> list[dict[str, Any]]:
        hand = ev.HandRevealed()
        event.unpack(hand)
        return [{"hand_revealed": hand}]

    def _round_settled(self, event: StoredEvent) -> list[dict[str, Any]]:
        settled = ev.RoundSettled()
        event.unpack(settled)
        mine = [b for b in settled.bets if b.player == self.watcher]
        result = table_pb2.RoundResult(
            status="settled",
            area_outcomes=settled.area_outcomes,
            my_bets=mine,
            my_net_minor=sum(b.net_minor for b in mine),
        )
        return [{"phase_changed": table_pb2.PhaseChanged(phase="settled")}, {"result": result}]

    def _round_voided(self, event: StoredEvent) -> list[dict[str, Any]]:
        voided = ev.RoundVoided()
        event.unpack(voided)
        return [
            {"phase_changed": table_pb2.PhaseChanged(phase="voided")},
            {"result": table_pb2.RoundResult(status="voided", void_reason=voided.reason)},
        ]

    def _seed_revealed(self, event: StoredEvent) -> list[dict[str, Any]]:
        seed = ev.SeedRevealed()
        event.unpack(seed)
        return [{"seed_revealed": seed}]


async def watch(
    pool: AsyncConnectionPool, notifier: Notifier | None, watcher: Principal, table_id: str, after_position: int
) -> AsyncIterator[table_pb2.TableUpdate]:
    """Updates after ``after_position``, folding from the round's opening so totals are right on resume."""
    start = await current_round_start(pool, table_id)
    position = min(start, after_position) if after_position else start
    state = WatchState(watcher, table_id)
    while True:
        events = await read_table_events(pool, table_id, position, READ_BATCH)
        for event in events:
            position = event.position
            for update in state.updates(event):
                if update.position > after_position:
                    yield update
        if len(events) < READ_BATCH:
            if notifier is not None:
                await notifier.wait(table_id, POLL_FALLBACK_S)
            else:
                await asyncio.sleep(POLL_FALLBACK_S / 4)
