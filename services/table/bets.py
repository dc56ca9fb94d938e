"""Bets: place, cancel, change (red envelope), and leaving a table with bets open.

Each command is load -> decide -> save: read the rows, check the table's limits and
the round shape's own rules (``RoundMachine.check_bet``), ask the wallet to hold
the worst case, then record the bet and its event in one transaction that
re-checks the betting window under a share lock on the round row, and the player's
stakes in the round under the table's ordering lock (the table maximum holds for bets
sent at the same moment too).

Bets placed at the same moment, at any tables, share the trips to the database
(``Grouped``): one read of four statements for all their checks, and, where the round
shape counts nothing in the bet's transaction, one recording transaction of one
statement per bet with one COMMIT (group commit). Each bet's outcome is its own
(recorded, window closed, raced), as alone; the tables' ordering locks are taken in
table order, so two groups never wait on each other in a cycle; a group that fails is
worked on again bet by bet. A player's bets sent in one call (PlaceBets, ``place_many``)
are placed side by side and so, as a rule, share all of these; within a table a group
records its bets in the order they arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from niuniu.table.v1 import events_pb2 as ev

from backbone.auth import Principal, Role, require
from backbone.db import sent_together
from backbone.errors import (
    AlreadyExists,
    DomainError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
    clip,
)
from backbone.eventstore import NewEvent
from backbone.grouping import Grouped
from bull.variants import Variant
from services.table.banker import StakeRefused
from services.table.common import (
    BET_GROUP_SIZE,
    BET_STAKES,
    BETS,
    BETS_REFUSED,
    CALLED_BETS_REFUSED,
    COMMAND_ID,
    HOLD_GRACE,
    MAX_STAKE_MINOR,
    BetReceipt,
    Phase,
    bet_stream,
    check_client_seed,
    player_account,
    scoped_id,
    unix_ms,
    variant_of,
)
from services.table.context import TableContext
from services.table.round_base import RoundMachine, check_not_closing, limits_of
from services.table.round_envelope import OneBetPerRound
from services.table.store import BetContext, BetQuery, Conn, Recorded, Row

CONFIG_CACHE_SIZE = 4_096
MAX_BET_GROUP = 64
"""Bound on the bets recorded in one transaction."""
BET_GROUPS_IN_FLIGHT = 2
"""Groups of bets being recorded at once, each on a connection of its own."""
MAX_BETS_WAITING = 1024
"""Bound on bets waiting for a group; one more is refused UNAVAILABLE TABLE_BUSY (its hold released)."""
MAX_BETS_PER_CALL = 16
"""Bound on the bets of one PlaceBets call."""
MAX_BETS_PER_ROUND = 2_048
"""Bound on a round's bets (any status; one more is refused FAILED_PRECONDITION ROUND_FULL, its hold
released): the round's settlement events (the table's RoundSettled, the wallet's
RoundSettlementApplied) grow with its bets and must fit in one Kafka record
(``backbone.eventstore.MAX_PAYLOAD_BYTES``, 4 MiB less 64 KiB). ``tests/table/test_round_size.py``
builds each variant's full round: the largest event is a red-envelope round's RoundSettlementApplied,
2.7 MB (1.3 KB a bet, 66 % of the limit); Golden Bull's is 1.4 MB."""
MAX_BETS_PER_PLAYER_ROUND = 128
"""Bound on one player's bets in a round (any status, cancelled ones too): one more is refused
FAILED_PRECONDITION PLAYER_ROUND_FULL. Without it one player betting and cancelling could take all of a
round's ``MAX_BETS_PER_ROUND`` and shut the others out of it."""


class RecordingBusy(Unavailable):
    """Too many bets waiting to be recorded: this one was not, and its hold is released."""


@dataclass(frozen=True)
class BetOrder:
    """One bet as a caller sends it (a PlaceBet request)."""

    command_id: str
    table_id: str
    area: str
    amount_minor: int
    round_id: str = ""
    client_seed: str = ""


@dataclass(frozen=True)
class Recording:
    """A bet to record, with the instant its window is checked against, the player's seed, the most
    the player may have staked in the round with it (the table maximum) and its place in the order the
    bets arrived (``arrival``: a group records a table's bets in that order)."""

    bet: dict[str, Any]
    now: datetime
    client_seed: str
    max_staked_minor: int
    arrival: int = 0


@dataclass(frozen=True)
class Admitted:
    """A bet that passed the checks made before its hold: the bet to hold and record, its round's machine,
    the most the player may have staked in the round with it, the variant and when its window closes."""

    bet: dict[str, Any]
    machine: RoundMachine
    max_staked_minor: int
    variant_id: str
    closes_at: datetime


class WindowClosed(FailedPrecondition):
    """The betting window closed between the checks and the recording of a bet."""


class RoundFull(FailedPrecondition):
    """The round had ``MAX_BETS_PER_ROUND`` bets, or the player ``MAX_BETS_PER_PLAYER_ROUND`` of them."""


class RoomTaken(FailedPrecondition):
    """The player's other bets of the round, recorded between the checks and this bet's recording, left no
    room for it under the table maximum."""


def attempt_hold_id(bet_id: str) -> str:
    """A hold id of its own for each attempt at placing a bet. A refused attempt voids its hold; had a
    retry with the same command id asked for the same hold id, the wallet would have answered it with
    the voided hold as a replay, and the bet would have been recorded with nothing held. A bet is
    recorded with the hold of the attempt that recorded it (``bets.hold_id``)."""
    return f"bet.{bet_id}.{secrets.token_hex(6)}"


def own_bet(stored: Sequence[Row], bet_id: str, command_id: str, player: str) -> Row | None:
    """The player's bet under its per-player id, or under the command id as sent (placed before command
    ids were per player: only the player's own)."""
    by_id = {row["bet_id"]: row for row in stored}
    legacy = by_id.get(command_id)
    return by_id.get(bet_id) or (legacy if legacy is not None and legacy["player"] == player else None)


def check_command_id(command_id: str) -> None:
    if not COMMAND_ID.fullmatch(command_id):
        raise InvalidArgument("COMMAND_ID_MALFORMED", "command_id must be 1-128 of letters, digits and . _ : -")


def window_open(window: tuple[str, Any] | None, now: Any) -> bool:
    return window is not None and window[0] == Phase.BETTING and now < window[1]


def check_chips(limits: ev.TableLimits, amount: int, *, fixed: bool) -> None:
    """The table minimum and the chips, which a fixed-price side bet ignores."""
    if not fixed and amount < limits.min_bet_minor:
        BETS_REFUSED.labels("BELOW_TABLE_MINIMUM").inc()
        raise FailedPrecondition("BELOW_TABLE_MINIMUM", f"the table minimum is {limits.min_bet_minor}")
    smallest_chip = min(limits.chips_minor)
    if not fixed and amount % smallest_chip:
        BETS_REFUSED.labels("NOT_A_CHIP_AMOUNT").inc()
        raise InvalidArgument("NOT_A_CHIP_AMOUNT", f"a bet is made of chips: a multiple of {smallest_chip}")


def check_amount(limits: ev.TableLimits, area: str, amount: int, fixed: int | None) -> None:
    """A bet's amount against the terms alone, before any state: its fixed price if the area has one, the
    table minimum and chips otherwise, and the per-player maximum against this one bet (what the player
    staked already is counted later, in ``Bets.check_stake``)."""
    if fixed is not None and amount != fixed:
        BETS_REFUSED.labels("FIXED_STAKE_REQUIRED").inc()
        raise InvalidArgument("FIXED_STAKE_REQUIRED", f"a bet on {area} costs exactly {fixed}")
    check_chips(limits, amount, fixed=fixed is not None)
    if amount > limits.max_bet_minor:
        BETS_REFUSED.labels("ABOVE_TABLE_MAXIMUM").inc()
        raise FailedPrecondition(
            "ABOVE_TABLE_MAXIMUM", f"the table maximum is {limits.max_bet_minor} per player and round"
        )


def check_room(
    max_minor: int, staked: int, amount: int, refusal: type[FailedPrecondition] = FailedPrecondition
) -> None:
    """The per-player maximum of a round (``max_minor``), against what the player staked in it already."""
    if staked + amount > max_minor:
        BETS_REFUSED.labels("ABOVE_TABLE_MAXIMUM").inc()
        raise refusal(
            "ABOVE_TABLE_MAXIMUM", f"the table maximum is {max_minor} per player and round; {staked} already staked"
        )


def check_round_room(bets_taken: int) -> None:
    """A round's bound on its bets (``MAX_BETS_PER_ROUND``), against the bets it has taken (any status)."""
    if bets_taken >= MAX_BETS_PER_ROUND:
        BETS_REFUSED.labels("ROUND_FULL").inc()
        raise RoundFull("ROUND_FULL", f"this round has taken its {MAX_BETS_PER_ROUND} bets; bet in the next one")


def check_player_round_room(player_bets: int) -> None:
    """A player's bound on their bets of a round (``MAX_BETS_PER_PLAYER_ROUND``), against those they placed in
    it (any status)."""
    if player_bets >= MAX_BETS_PER_PLAYER_ROUND:
        BETS_REFUSED.labels("PLAYER_ROUND_FULL").inc()
        raise RoundFull(
            "PLAYER_ROUND_FULL",
            f"you have placed {MAX_BETS_PER_PLAYER_ROUND} bets this round (cancelled ones count); bet in the next one",
        )


class Bets:
    def __init__(self, ctx: TableContext, machine_for: Callable[[Variant], RoundMachine]) -> None:
        self._ctx = ctx
        self._store = ctx.store
        self._machine_for = machine_for
        self._configs: dict[tuple[str, str, int], Any] = {}
        self._arrivals = itertools.count()
        self._recordings: Grouped[Recording, Recorded] = Grouped(
            self._record_group,
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

    async def place(
        self,
        who: Principal,
        command_id: str,
        table_id: str,
        area: str,
        amount_minor: int,
        round_id: str = "",
        client_seed: str = "",
    ) -> BetReceipt:
        require(who, Role.PLAYER)
        arrival = next(self._arrivals)
        check_command_id(command_id)
        if not 0 < amount_minor <= MAX_STAKE_MINOR:
            raise InvalidArgument("AMOUNT_INVALID", "amount_minor must be positive (and at most 10^13)")
        check_client_seed(client_seed)
        player = player_account(who)
        bet_id = scoped_id(player, command_id)
        # One round trip for the bet (under either id), the table, its round and the player's stakes there,
        # shared with the bets being placed at the same moment (``_read_group``).
        stored, table, current, staked, player_bets = await self._contexts(
            BetQuery(table_id, (bet_id, command_id), player)
        )
        existing = own_bet(stored, bet_id, command_id, player)
        if existing is not None:
            return replay(existing, player, table_id, area, amount_minor)
        admitted = await self._admit(
            BetOrder(command_id, table_id, area, amount_minor, round_id, client_seed),
            bet_id,
            player,
            table,
            current,
            (staked, player_bets),
        )
        bet = admitted.bet
        await self._hold(bet, admitted.closes_at)
        try:
            receipt = await self._record(bet, admitted.machine, admitted.max_staked_minor, client_seed, arrival)
        except (WindowClosed, OneBetPerRound, RoomTaken, RoundFull, StakeRefused, RecordingBusy):
            # Refused after the wallet held: the bet rolled back, so its hold goes too.
            await self._ctx.wallet.void_hold(bet["hold_id"])
            raise
        if receipt.replayed:
            # The same command, sent twice at once, was recorded by the other call with that call's
            # own hold: this one's holds nothing the table's record needs.
            await self._ctx.wallet.void_hold(bet["hold_id"])
            return receipt
        BETS.labels(admitted.variant_id, area).inc()
        BET_STAKES.labels(admitted.variant_id).inc(amount_minor)
        self._ctx.wake(table_id)
        return receipt

    async def _admit(
        self,
        order: BetOrder,
        bet_id: str,
        player: str,
        table: Row | None,
        current: Row | None,
        player_room: tuple[int, int],
    ) -> Admitted:
        """A new bet checked against the table, its round and the player's bets there (checked again,
        atomically, when it is recorded)."""
        if table is None:
            raise NotFound("TABLE_NOT_FOUND", f"no table {clip(order.table_id)}")
        check_not_closing(table)
        variant = variant_of(table["variant"])
        if order.area not in variant.areas:
            raise InvalidArgument("AREA_UNKNOWN", f"area must be one of {', '.join(variant.areas)}")
        # What the bet itself gets wrong is answered whatever the clock: the same mistake sent a
        # moment later must not turn into BETTING_CLOSED. The round's terms if one is open (its
        # configuration and limits as they were when it opened), else the table's.
        terms = current if current is not None else table
        config = self.config_of(variant, terms)
        check_amount(limits_of(terms), order.area, order.amount_minor, variant.fixed_stake_minor(order.area, config))
        self._check_open(current, order.round_id)
        assert current is not None  # and so ``config`` is the round's
        staked, player_bets = player_room
        check_round_room(current["bets_taken"])  # again when recorded, under the table's lock
        check_player_round_room(player_bets)  # the same
        limits = limits_of(current)
        check_room(limits.max_bet_minor, staked, order.amount_minor)  # again when recorded, under the table's lock
        machine = self._machine_for(variant)
        if machine.checks_bets:  # a shape with rules of its own (a banker's)
            async with self._store.read() as conn:
                await machine.check_bet(conn, config, current["round_id"], player, order.amount_minor)
        bet = {
            "bet_id": bet_id,
            "round_id": current["round_id"],
            "table_id": order.table_id,
            "player": player,
            "area": order.area,
            "stake_minor": order.amount_minor,
            "hold_minor": variant.hold_minor(order.amount_minor, config),
            "hold_id": attempt_hold_id(bet_id),
            "client_seed": order.client_seed,  # its BetPlaced and its receipt say what it contributed
        }
        return Admitted(bet, machine, limits.max_bet_minor, variant.variant_id, current["betting_closes_at"])

    async def _hold(self, bet: Mapping[str, Any], closes_at: datetime) -> None:
        """The wallet holds the bet's worst case under this attempt's own hold id."""
        expires = unix_ms(closes_at + HOLD_GRACE)
        try:
            await self._ctx.wallet.place_hold(
                bet["hold_id"], bet["player"], bet["hold_minor"], f"bet on {bet['area']}", bet["round_id"], expires
            )
        except Unavailable:
            # The wallet may have placed the hold before the call timed out: release it now
            # rather than leave it to its expiry (VoidHold is idempotent and a no-op if absent).
            with contextlib.suppress(DomainError):
                await self._ctx.wallet.void_hold(bet["hold_id"])
            raise

    async def place_many(self, who: Principal, orders: Sequence[BetOrder]) -> list[BetReceipt | DomainError]:
        """Several bets of one player sent in one call (PlaceBets), each placed as ``place`` places it, all
        at once: they share the reads, the wallet call and the recording transaction of the bets placed
        at the same moment, and a group records them in the order sent. One outcome per bet, in order:
        its receipt or its refusal. Anything else that goes wrong with one of them (not a refusal) fails
        the call, once every bet is decided: the bets placed are then answered as replayed when asked
        again."""
        require(who, Role.PLAYER)
        if not 0 < len(orders) <= MAX_BETS_PER_CALL:
            raise InvalidArgument("BETS_COUNT", f"a call places 1 to {MAX_BETS_PER_CALL} bets, not {len(orders)}")
        if len({o.command_id for o in orders}) < len(orders):
            raise InvalidArgument("COMMAND_ID_REPEATED", "each bet of a call needs a command_id of its own")
        placing = [
            self.place(who, o.command_id, o.table_id, o.area, o.amount_minor, o.round_id, o.client_seed) for o in orders
        ]
        decided: list[BetReceipt | DomainError] = []
        for outcome in await asyncio.gather(*placing, return_exceptions=True):
            if not isinstance(outcome, BetReceipt | DomainError):
                raise outcome
            if isinstance(outcome, DomainError):
                CALLED_BETS_REFUSED.labels(outcome.reason).inc()
            decided.append(outcome)
        return decided

    def config_of(self, variant: Variant, current: Row) -> Any:
        """The round's parsed configuration, parsed once per (table, variant, config version).

        A round stores the table's configuration and its version as they were when it opened;
        a table's configuration changes only with a new version, so the key names one text.
        """
        key = (current["table_id"], variant.variant_id, current["config_version"])
        config = self._configs.get(key)
        if config is None:
            if len(self._configs) >= CONFIG_CACHE_SIZE:
                self._configs.clear()
            config = self._configs[key] = variant.parse_config(current["config"])
        return config

    def _check_open(self, current: Row | None, round_id: str) -> None:
        if current is None or current["phase"] != Phase.BETTING or self._ctx.now() >= current["betting_closes_at"]:
            BETS_REFUSED.labels("BETTING_CLOSED").inc()
            raise FailedPrecondition("BETTING_CLOSED", "no round is taking bets at this table right now")
        if round_id and round_id != current["round_id"]:
            BETS_REFUSED.labels("ROUND_MISMATCH").inc()
            raise FailedPrecondition("ROUND_MISMATCH", f"round {round_id} is not the round taking bets")

    async def check_stake(
        self,
        conn: Conn,
        current: Row,
        player: str,
        amount: int,
        *,
        replacing: str = "",
    ) -> None:
        """A changed bet's new amount: the table minimum and chips, and the per-player maximum.

        ``replacing``: the bet this amount replaces (a changed bet), not counted as staked.
        """
        limits = limits_of(current)
        check_chips(limits, amount, fixed=False)
        staked = await self._store.staked_minor(conn, current["round_id"], player, replacing)
        check_room(limits.max_bet_minor, staked, amount)

    async def _record(
        self, bet: dict[str, Any], machine: RoundMachine, max_staked_minor: int, client_seed: str, arrival: int
    ) -> BetReceipt:
        """The bet and its event: one statement that re-checks the window under a share lock on the round
        row and the player's room under the table maximum, inserts the bet and appends BetPlaced only if it
        inserted it (``TableStore.record_bet``), after an earlier statement of its transaction took the
        table's ordering lock (so the room counts every bet of the player's recorded before it).

        Where the shape counts stakes in the bet's transaction (``reserve``: a banker's table cap) the bet
        has a transaction of its own; otherwise it goes with the bets recorded at the same moment
        (``_record_group``), its COMMIT queued behind the statements (pipeline mode): the tables' ordering
        locks are then held for no client round trip at all.
        """
        now = self._ctx.now()
        if not machine.reserves_stakes:
            recorded = await self._recordings(Recording(bet, now, client_seed, max_staked_minor, arrival))
        else:
            recorded = await self._record_reserving(bet, machine, client_seed, now, max_staked_minor)
        if recorded.inserted:
            return BetReceipt.of({**bet, "status": "placed"}, replayed=False)
        if not window_open(recorded.window, now):
            BETS_REFUSED.labels("BETTING_CLOSED").inc()
            raise WindowClosed("BETTING_CLOSED", "betting closed before the bet could be recorded")
        async with self._store.read() as conn:
            existing = await self._store.bet(conn, bet["bet_id"])  # the same command raced
        if existing is not None:
            return replay(existing, bet["player"], bet["table_id"], bet["area"], bet["stake_minor"])
        check_room(max_staked_minor, recorded.staked, bet["stake_minor"], RoomTaken)  # their other bets came first
        check_round_room(recorded.round_bets)  # the round filled meanwhile
        check_player_round_room(recorded.player_bets)  # the player's other bets filled their share meanwhile
        # A red-envelope player's other bet (one per round) won.
        raise OneBetPerRound("ALREADY_BET", "you have bet this round: change that bet with ChangeBet")

    def _append_placed(self, bet: Mapping[str, Any]) -> tuple[str, dict[str, object]]:
        """The strict append of the bet's BetPlaced to its new stream, for ``TableStore.record_bet``."""
        placed = ev.BetPlaced(**bet)
        event = NewEvent("table.bet_placed", placed, correlation_id=bet["round_id"], causation_id=bet["bet_id"])
        return self._store.events.append_call(bet_stream(bet["table_id"], bet["bet_id"]), 0, [event])

    async def _record_reserving(
        self, bet: dict[str, Any], machine: RoundMachine, client_seed: str, now: datetime, max_staked_minor: int
    ) -> Recorded:
        """One bet and the shape's count of its stake (``reserve``), in a transaction of its own."""
        append = self._append_placed(bet)
        async with self._store.pool.connection() as conn, sent_together(conn):
            await self._store.lock_for_recording(conn, [bet["round_id"]], bet_stream(bet["table_id"], bet["bet_id"]))
            cursor = await self._store.record_bet(
                conn, bet, now, client_seed, append, max_staked_minor, MAX_BETS_PER_ROUND, MAX_BETS_PER_PLAYER_ROUND
            )
            recorded = await self._store.bet_recorded(cursor)
            if recorded.inserted:
                await machine.reserve(conn, bet["round_id"], bet["player"], bet["stake_minor"], bet["hold_id"])
        return recorded

    async def _read_group(self, queries: list[BetQuery]) -> list[BetContext]:
        async with self._store.read() as conn:
            return await self._store.bet_contexts(conn, queries)

    async def _record_group(self, recordings: Sequence[Recording]) -> list[Recorded]:
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
                    append = self._append_placed(r.bet)
                    cursors[i] = await self._store.record_bet(
                        conn,
                        r.bet,
                        r.now,
                        r.client_seed,
                        append,
                        r.max_staked_minor,
                        MAX_BETS_PER_ROUND,
                        MAX_BETS_PER_PLAYER_ROUND,
                    )
            return [await self._store.bet_recorded(cursors[i]) for i in range(len(recordings))]

    async def cancel(self, who: Principal, table_id: str, bet_id: str, *, cause: str = "player") -> BetReceipt:
        """Cancel a bet in its betting window, once: of two cancels of one bet, however close, one cancels
        it (and gives its stake back to the shape's count) and the other answers it as replayed."""
        require(who, Role.PLAYER)
        player = player_account(who)
        async with self._store.read() as conn:
            bet = await self.own_bet_at(conn, player, table_id, bet_id)
            variant = (await self._store.table(conn, table_id))["variant"]
        async with self._store.transaction() as conn:
            # The round's row, then the table's ordering lock, then the bet's row: the order a bet's
            # recording takes them in (``lock_for_recording``), so a cancel and a bet never wait in a cycle.
            await self._store.lock_for_recording(conn, [bet["round_id"]], bet_stream(table_id, bet["bet_id"]))
            locked = await self._store.bet(conn, bet["bet_id"], lock=True)
            assert locked is not None
            fresh = locked["status"] != "cancelled"
            if fresh:
                await self._cancel_locked(conn, locked, variant, cause)
        # The settlement lists this hold again, so the wallet releases it even if this call is lost; a
        # repeated cancel asks again (the wallet answers a repeated void as the first).
        await self._ctx.wallet.void_hold(locked["hold_id"])
        if fresh:
            self._ctx.wake(table_id)
        return BetReceipt.of({**locked, "status": "cancelled"}, replayed=not fresh)

    async def own_bet_at(self, conn: Conn, player: str, table_id: str, bet_id: str) -> Row:
        """The player's bet at the table, by the PlaceBet command id (the contract) or by the bet id a
        receipt or a round view showed."""
        bet = await self._store.bet(conn, scoped_id(player, bet_id)) or await self._store.bet(conn, bet_id)
        if bet is None or bet["table_id"] != table_id or bet["player"] != player:
            raise NotFound("BET_NOT_FOUND", f"you have no bet {clip(bet_id)} at table {clip(table_id)}")
        return bet

    async def _cancel_locked(self, conn: Conn, bet: Row, variant: str, cause: str) -> None:
        """The cancel itself, under the bet's row lock: refused outside the betting window."""
        if bet["status"] != "placed" or not window_open(
            await self._store.window(conn, bet["round_id"]), self._ctx.now()
        ):
            raise FailedPrecondition("BETTING_CLOSED", "a bet can be cancelled only during the betting window")
        await self._store.cancel_bet(conn, bet["bet_id"])
        await self._machine_for(variant_of(variant)).release(conn, bet["round_id"], bet["stake_minor"])
        cancelled = ev.BetCancelled(
            table_id=bet["table_id"], round_id=bet["round_id"], bet_id=bet["bet_id"], player=bet["player"], cause=cause
        )
        await self._store.append(
            conn,
            bet_stream(bet["table_id"], bet["bet_id"]),
            "table.bet_cancelled",
            cancelled,
            correlation_id=bet["round_id"],
        )

    async def cancel_open(self, who: Principal, table_id: str) -> list[str]:
        """Cancel the player's bets of a round still in its betting window (leaving the table)."""
        async with self._store.read() as conn:
            table = await self._store.table(conn, table_id)
            await self._store.unseat(conn, table_id, who.subject)
            round_id = table["current_round_id"]
            bet_ids = await self._store.open_bet_ids(conn, round_id, player_account(who)) if round_id else []
        refunded = []
        for bet_id in bet_ids:
            try:
                await self.cancel(who, table_id, bet_id, cause="left")
                refunded.append(bet_id)
            except FailedPrecondition:
                pass  # the cards are being opened: the bet settles normally
        return refunded


def replay(existing: Mapping[str, Any], player: str, table_id: str, area: str, amount: int) -> BetReceipt:
    same = (existing["player"], existing["table_id"], existing["area"], existing["stake_minor"]) == (
        player,
        table_id,
        area,
        amount,
    )
    if not same:
        raise AlreadyExists("COMMAND_ID_REUSED", "this command id was used for a different bet")
    return BetReceipt.of(existing, replayed=True)
