"""Live table updates for frontends, redacted for the watcher.

A watcher reads the table's events from the service's own event store (its
stream and its bets' streams) after a position, folds the round in play with
``evolve`` into the read model GetRound and ListRounds answer from (``core/``),
and turns each event into the updates this watcher may see: everyone sees phases,
area totals, revealed hands and area results; only the bettor sees their own bets
and amounts. No event of the table carries a card before its reveal, so neither
the folded round nor any update can. Redis pub/sub wakes watchers when a table
moves; without it they poll, so Redis stays a convenience.

The stream contract (docs/api/frontend/stream.md):

- Positions. One event gives a watcher a few updates (a bet: the bettor's own bet, the
  new area totals, a banked table's allowance), so an update's position is
  ``event position x SLOTS + its index among that event's updates``: unique, strictly
  increasing, and a resume after any of them delivers exactly the rest. The updates of
  an event are a function of the event and of the round's events before it, so the
  watcher's state is always folded from the opening of the round the resume point is in.
- A position that names no event of this table, or an event older than the last
  ``RESUME_ROUNDS`` openings, is OUT_OF_RANGE before anything is sent.
- Every update carries the server's clock; a heartbeat follows ``HEARTBEAT_S`` of silence.
- A watcher with a stake in a settled or voided round gets a ``balance`` update after the
  result, once the wallet has applied the round's settlement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import grpc
from google.protobuf.message import Message
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from backbone.auth import Principal
from backbone.errors import DomainError
from backbone.eventreads import in_family, last_position_of, nth_last_position_of, read_family
from backbone.eventstore import StoredEvent
from services.table.allowance import with_allowance
from services.table.banker import is_banked
from services.table.common import player_account, table_stream, unix_ms
from services.table.context import TableContext
from services.table.core.evolve import EVENT_TYPES, evolve
from services.table.core.state import RoundState
from services.table.core.view import watched_area_totals

log = logging.getLogger(__name__)

POLL_FALLBACK_S = 1.0
READ_BATCH = 500
CHANNEL_PREFIX = "niuniu:table-events:"
MOVED, STEPPED = "1", "step"
"""An announcement's message: a move (a bet, a bid, a seat, a closing...), or only the round runner's own step."""
SLOTS = 16
"""Positions per event: an event gives one watcher at most a handful of updates (asserted)."""
HEARTBEAT_S = 5.0
RESUME_ROUNDS = 20
"""A resume point must lie in one of the table's last RESUME_ROUNDS rounds (or after them)."""
SETTLEMENT_WAIT_S = 30.0
SETTLEMENT_POLL_S = 0.05


class OutOfRange(DomainError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Notifier:
    """One Redis subscription per process; wakes every watcher of a table when it moves, and the table's
    round runner when the move is not the runner's own step (an announcement says which: ``STEPPED``)."""

    def __init__(self, redis: Redis, prefix: str = "") -> None:
        self._redis = redis
        self._prefix = f"{CHANNEL_PREFIX}{prefix}"
        self._events: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self._moves: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self._sending: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._moved: set[str] = set()

    def publish(self, table_id: str, stepped: bool = False) -> None:
        """Wake the table's watchers: one PUBLISH in flight per table, the moves meanwhile folded into one more.

        A watcher re-reads the table from the database when woken, so one wake-up sent after a move
        covers every move before it: a busy table costs a PUBLISH per Redis round trip, not one per bet.
        An announcement is ``STEPPED`` only when every move it covers is the round runner's own step.
        """
        if not stepped:
            self._moved.add(table_id)
        if table_id in self._sending:
            self._again.add(table_id)
            return
        self._sending[table_id] = asyncio.get_running_loop().create_task(self._send(table_id))

    async def _send(self, table_id: str) -> None:
        try:
            while True:
                self._again.discard(table_id)
                kind = MOVED if table_id in self._moved else STEPPED
                self._moved.discard(table_id)
                # A lost wake-up only delays watchers until their next poll, a runner until its next rest.
                with contextlib.suppress(Exception):
                    await self._redis.publish(self._prefix + table_id, kind)
                if table_id not in self._again:
                    return
        finally:
            self._sending.pop(table_id, None)

    def next_move(self, table_id: str) -> asyncio.Event:
        """An event set when a move of the table that is not its runner's step is announced (after this
        call): the round runner takes it before it reads the table, so a move during its step wakes it."""
        return self._moves[table_id]

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
                        woken = [self._events.pop(table_id, None)]
                        if message["data"] not in (STEPPED, STEPPED.encode()):
                            woken.append(self._moves.pop(table_id, None))
                        for event in woken:
                            if event is not None:
                                event.set()
            except Exception:
                log.warning("table notifier lost Redis; watchers fall back to polling", exc_info=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)


ROUND_OPENED = "table.round_opened"


async def read_table_events(pool: AsyncConnectionPool, table_id: str, after: int, limit: int) -> list[StoredEvent]:
    """The table's events and its bets' after position ``after``, in position order."""
    async with pool.connection() as conn:
        return await read_family(conn, table_stream(table_id), after, limit)


async def current_round_start(pool: AsyncConnectionPool, table_id: str) -> int:
    """The position just before the current round's opening (0 if no round yet)."""
    async with pool.connection() as conn:
        opened = await last_position_of(conn, table_stream(table_id), ROUND_OPENED)
    return opened - 1 if opened else 0


async def resume_start(pool: AsyncConnectionPool, table_id: str, after_position: int) -> int:
    """The event position to read after so that the fold starts at the opening of the round
    ``after_position`` lies in. OUT_OF_RANGE for a position this table never gave or no longer keeps."""
    if after_position == 0:
        return await current_round_start(pool, table_id)
    if after_position < 0:
        raise OutOfRange("POSITION_UNKNOWN", "after_position must be 0 or a position the stream sent")
    event_position = after_position // SLOTS
    stream = table_stream(table_id)
    async with pool.connection() as conn:
        if not await in_family(conn, stream, event_position):
            raise OutOfRange("POSITION_UNKNOWN", "this table's stream never sent that position: watch again from 0")
        oldest_kept = await nth_last_position_of(conn, stream, ROUND_OPENED, RESUME_ROUNDS)
        if oldest_kept is not None and event_position < oldest_kept:
            raise OutOfRange(
                "POSITION_TOO_OLD",
                f"resume works within the last {RESUME_ROUNDS} rounds: watch again from 0 and read GetRound",
            )
        opened = await last_position_of(conn, stream, ROUND_OPENED, event_position)
    return opened - 1 if opened else 0


class WatchState:
    """Turns the table's events into what one watcher may see, from the round's read model.

    The round in play is the ``RoundState`` that ``evolve`` folds from its events, the read model
    GetRound and ListRounds answer from (``core/view.py``): the area totals sent and whether the
    watcher has money in the round are read from it, and the rest of an update is the event's
    public payload. An event of another round (a late seed reveal, an operator's void of an
    earlier round) is relayed and folds into nothing: ``round`` stays the round in play.
    """

    def __init__(self, watcher: Principal, table: Mapping[str, Any]) -> None:
        self.watcher = player_account(watcher)
        self.table_id = str(table["table_id"])
        self._variant = str(table["variant"])
        # The settings the next round opened takes, as its row records them for GetRound; the round in
        # play at the start takes the table's as they are then (its own unless changed since). No update
        # carries them.
        self._config = tuple(sorted(table["config"].items()))
        self._limits = ev.TableLimits.FromString(table["limits"])
        self.round: RoundState | None = None

    def updates(self, event: StoredEvent) -> list[table_pb2.TableUpdate]:
        """The updates ``event`` gives this watcher, read after the round in play has folded it."""
        payload_type = EVENT_TYPES.get(event.event_type)
        if payload_type is None:
            return []
        payload = event.unpack(payload_type())
        round_id = event.envelope.correlation_id
        self._fold(payload, round_id)
        handler = getattr(self, "_" + event.event_type.removeprefix("table."), None)
        return [
            table_pb2.TableUpdate(position=event.position, table_id=self.table_id, round_id=round_id, **fields)
            for fields in (handler(payload) if handler is not None else [])
        ]

    def _fold(self, event: Message, round_id: str) -> None:
        """A round opened starts the round in play; an event of that round evolves it; a config change
        gives the rounds opened after it their settings."""
        if isinstance(event, ev.ConfigChanged):
            self._config, self._limits = tuple(sorted(event.config.items())), event.limits
        elif isinstance(event, ev.RoundOpened):
            start = RoundState(self.table_id, round_id, self._variant, self._config, self._limits)
            self.round = evolve(start, event)
        elif self.round is not None and round_id == self.round.round_id:
            self.round = evolve(self.round, event)

    def _involved(self) -> bool:
        """The watcher has money in the round in play: a bet (even cancelled), a bid, the banker or dealer seat."""
        state = self.round
        if state is None:
            return False
        players = {bet.player for bet in state.bets} | {bid.player for bid in state.bids}
        return state.dealer == self.watcher or self.watcher in players

    def _totals(self) -> dict[str, Any]:
        return {"area_totals": watched_area_totals(self.round) if self.round else table_pb2.AreaTotals()}

    def _round_opened(self, opened: ev.RoundOpened) -> list[dict[str, Any]]:
        if opened.bidding_closes_at_unix_ms:  # red envelope: the dealer seat is bid for first
            phase = table_pb2.PhaseChanged(phase="bidding", deadline_unix_ms=opened.bidding_closes_at_unix_ms)
        else:
            phase = table_pb2.PhaseChanged(phase="betting", deadline_unix_ms=opened.betting_closes_at_unix_ms)
        return [{"round_opened": opened}, {"phase_changed": phase}]

    def _bet_placed(self, placed: ev.BetPlaced) -> list[dict[str, Any]]:
        mine = [{"my_bet_placed": placed}] if placed.player == self.watcher else []
        return [*mine, self._totals()]

    def _bet_cancelled(self, cancelled: ev.BetCancelled) -> list[dict[str, Any]]:
        mine = [{"my_bet_cancelled": cancelled}] if cancelled.player == self.watcher else []
        return [*mine, self._totals()]

    def _bet_changed(self, changed: ev.BetChanged) -> list[dict[str, Any]]:
        mine = [{"my_bet_changed": changed}] if changed.player == self.watcher else []
        return [*mine, self._totals()]

    def _bid_placed(self, bid: ev.BidPlaced) -> list[dict[str, Any]]:
        return [{"bid_placed": bid}]  # bids are public: everyone sees the amount to beat

    def _dealer_chosen(self, chosen: ev.DealerChosen) -> list[dict[str, Any]]:
        phase = table_pb2.PhaseChanged(phase="betting", deadline_unix_ms=chosen.betting_closes_at_unix_ms)
        return [{"phase_changed": phase}, {"dealer_chosen": chosen}]

    def _envelope_sent(self, sent: ev.EnvelopeSent) -> list[dict[str, Any]]:
        # who takes part and the total; each amount only in its grab
        return [{"phase_changed": table_pb2.PhaseChanged(phase="revealing")}, {"envelope_sent": sent}]

    def _envelope_grabbed(self, grabbed: ev.EnvelopeGrabbed) -> list[dict[str, Any]]:
        return [{"envelope_grabbed": grabbed}]

    def _betting_closed(self, closed: ev.BettingClosed) -> list[dict[str, Any]]:
        return [{"phase_changed": table_pb2.PhaseChanged(phase="dealing")}]

    def _dealt(self, dealt: ev.Dealt) -> list[dict[str, Any]]:
        # public facts only: no hand's card (百變牛牛's drawn card is shown and burned)
        return [{"phase_changed": table_pb2.PhaseChanged(phase="revealing")}, {"dealt": dealt}]

    def _hand_revealed(self, hand: ev.HandRevealed) -> list[dict[str, Any]]:
        return [{"hand_revealed": hand}]

    def _round_settled(self, settled: ev.RoundSettled) -> list[dict[str, Any]]:
        mine = [b for b in settled.bets if b.player == self.watcher]
        net = sum(b.net_minor for b in mine)
        result = table_pb2.RoundResult(
            status="settled", area_outcomes=settled.area_outcomes, my_bets=mine, my_net_minor=net
        )
        paid = any(self.watcher in (t.payer, t.payee) for t in settled.transfers)
        made: list[dict[str, Any]] = [{"phase_changed": table_pb2.PhaseChanged(phase="settled")}, {"result": result}]
        return made + self._balance(net) if self._involved() or mine or paid else made

    def _round_voided(self, voided: ev.RoundVoided) -> list[dict[str, Any]]:
        made: list[dict[str, Any]] = [
            {"phase_changed": table_pb2.PhaseChanged(phase="voided")},
            {"result": table_pb2.RoundResult(status="voided", void_reason=voided.reason)},
        ]
        return made + self._balance(0) if self._involved() else made

    def _balance(self, net_minor: int) -> list[dict[str, Any]]:
        # Filled in (the wallet's balance once it has applied the settlement) only if it is sent.
        return [{"balance": table_pb2.BalanceChanged(account=self.watcher, net_minor=net_minor)}]

    def _seed_revealed(self, seed: ev.SeedRevealed) -> list[dict[str, Any]]:
        return [{"seed_revealed": seed}]


def _heartbeat(table_id: str) -> table_pb2.TableUpdate:
    return table_pb2.TableUpdate(table_id=table_id, heartbeat=table_pb2.Heartbeat(interval_seconds=int(HEARTBEAT_S)))


async def watch(
    pool: AsyncConnectionPool,
    notifier: Notifier | None,
    state: WatchState,
    start: int,
    heartbeat_s: float = HEARTBEAT_S,
) -> AsyncIterator[table_pb2.TableUpdate]:
    """Every update of the events after ``start`` (each with its event's position), and a
    heartbeat whenever nothing was sent for ``heartbeat_s``. ``state`` has folded an event
    before its updates are yielded."""
    position = start
    table_id = state.table_id
    last_sent = time.monotonic()
    while True:
        events = await read_table_events(pool, table_id, position, READ_BATCH)
        for event in events:
            position = event.position
            for update in state.updates(event):
                last_sent = time.monotonic()
                yield update
        if len(events) < READ_BATCH:
            quiet_s = time.monotonic() - last_sent
            if quiet_s >= heartbeat_s:
                last_sent = time.monotonic()
                yield _heartbeat(table_id)
                quiet_s = 0.0
            wait_s = min(POLL_FALLBACK_S if notifier is not None else POLL_FALLBACK_S / 4, heartbeat_s - quiet_s)
            if notifier is not None:
                await notifier.wait(table_id, wait_s)
            else:
                await asyncio.sleep(wait_s)


async def watch_table(
    ctx: TableContext,
    notifier: Notifier | None,
    watcher: Principal,
    table: Mapping[str, Any],
    after_position: int,
) -> AsyncGenerator[table_pb2.TableUpdate, None]:
    """The WatchTable stream: numbered updates after ``after_position`` (module docstring)."""
    table_id = str(table["table_id"])
    start = await resume_start(ctx.store.pool, table_id, after_position)
    state = WatchState(watcher, table)
    updates = watch(ctx.store.pool, notifier, state, start, HEARTBEAT_S)
    if is_banked(table["variant"]):  # BetAllowance after openings and bets
        updates = with_allowance(ctx, updates, watcher, table, lambda: state.round)
    event, index, last = -1, 0, after_position
    async for source in updates:
        update = table_pb2.TableUpdate()
        update.CopyFrom(source)  # the allowance reads the source after it is sent: leave its position alone
        if update.WhichOneof("update") == "heartbeat":
            update.position = last
        else:
            index = index + 1 if source.position == event else 0
            event = source.position
            assert index < SLOTS, f"event {event} gave more than {SLOTS} updates"
            numbered = event * SLOTS + index
            if numbered <= after_position:
                continue  # delivered before the resume point
            if update.WhichOneof("update") == "balance":
                async for waiting in _settlement_applied(ctx, update, last):
                    yield waiting
            update.position = last = numbered
        update.server_time_unix_ms = unix_ms(ctx.now())
        yield update


async def _settlement_applied(
    ctx: TableContext, update: table_pb2.TableUpdate, last: int
) -> AsyncIterator[table_pb2.TableUpdate]:
    """Fill ``update.balance`` once the wallet has applied the round's settlement; meanwhile
    heartbeats at ``last``, the position sent before it."""
    deadline = time.monotonic() + SETTLEMENT_WAIT_S
    beat = time.monotonic() + HEARTBEAT_S
    status = ""
    while not status:
        with contextlib.suppress(DomainError):
            status = await ctx.wallet.settlement_status(update.round_id) or ""
        if status or time.monotonic() >= deadline:
            break
        if time.monotonic() >= beat:
            beat = time.monotonic() + HEARTBEAT_S
            heartbeat = _heartbeat(update.table_id)
            heartbeat.position = last
            heartbeat.server_time_unix_ms = unix_ms(ctx.now())
            yield heartbeat
        await asyncio.sleep(SETTLEMENT_POLL_S)
    update.balance.settlement_status = status or "pending"
    with contextlib.suppress(DomainError):
        update.balance.available_minor = await ctx.wallet.balance_minor(update.balance.account)
