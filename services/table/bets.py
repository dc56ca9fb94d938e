"""Bets: place, cancel, change (red envelope), and leaving a table with bets open.

Each command is load -> decide -> save: read the rows, check the table's terms and
the round's admission (``admission.verify_bet``) with the round shape's own rules
(``RoundMachine.check_bet``), ask the wallet to hold the worst case, then record the bet
and its event in one transaction whose statement guards the same admission atomically
(the betting window under a share lock on the round row, the player's stakes in the
round under the table's ordering lock: the table maximum holds for bets sent at the same
moment too) and returns the facts it decided on; a bet it did not record is refused by
``verify_bet`` on those facts.

The reads and the recordings of bets placed at the same moment share their trips to the
database (``recording.BetGroups``). A player's bets sent in one call (PlaceBets,
``place_many``) are placed side by side and so, as a rule, share all of these; within a
table a group records its bets in the order they arrived.
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
from backbone.errors import (
    AlreadyExists,
    DomainError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
    clip,
)
from bull.variants import Variant
from services.table.admission import BetFacts, BetRefused, Bounds, Order, Refusal, verify_bet, window_open
from services.table.common import (
    BET_STAKES,
    BETS,
    BETS_REFUSED,
    CALLED_BETS_REFUSED,
    COMMAND_ID,
    HOLD_GRACE,
    MAX_STAKE_MINOR,
    BetReceipt,
    bet_stream,
    check_client_seed,
    player_account,
    scoped_id,
    unix_ms,
    variant_of,
)
from services.table.context import TableContext
from services.table.recording import BetGroups, Recording, RecordingBusy
from services.table.round_base import RoundMachine, check_not_closing, limits_of
from services.table.store import BetContext, BetQuery, Conn, Recorded, Row

CONFIG_CACHE_SIZE = 4_096
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


@dataclass(frozen=True)
class BetOrder:
    """One bet as a caller sends it (a PlaceBet request)."""

    command_id: str
    table_id: str
    area: str
    amount_minor: int
    round_id: str = ""
    client_seed: str = ""

    def admitted(self) -> Order:
        """What the admission reads of it (``verify_bet``)."""
        return Order(self.amount_minor, self.round_id)


@dataclass(frozen=True)
class Admitted:
    """A bet that passed the checks made before its hold: the bet to hold and record, its round's machine,
    the bounds it is admitted under, the variant and when its window closes."""

    bet: dict[str, Any]
    machine: RoundMachine
    bounds: Bounds
    variant_id: str
    closes_at: datetime


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


def check_order(command_id: str, amount_minor: int, client_seed: str) -> None:
    """What a PlaceBet gets wrong by itself: its command id, its amount's range, its client seed."""
    check_command_id(command_id)
    if not 0 < amount_minor <= MAX_STAKE_MINOR:
        raise InvalidArgument("AMOUNT_INVALID", "amount_minor must be positive (and at most 10^13)")
    check_client_seed(client_seed)


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


def facts_before_hold(context: BetContext, now: datetime, bounds: Bounds, machine: RoundMachine) -> BetFacts:
    """The admission's facts as the checks' read found them (``TableStore.bet_contexts``)."""
    current = context.current
    return BetFacts(
        phase=None if current is None else current["phase"],
        closes_at=None if current is None else current["betting_closes_at"],
        now=now,
        round_id="" if current is None else current["round_id"],
        staked_minor=context.staked,
        round_bets=0 if current is None else current["bets_taken"],
        player_bets=context.player_bets,
        player_open_bets=context.player_open_bets,
        bounds=bounds,
        one_bet_per_round=machine.one_bet_per_round,
    )


def facts_recorded(recorded: Recorded, r: Recording, machine: RoundMachine) -> BetFacts:
    """The admission's facts as the recording statement found them (``TableStore.record_bet``)."""
    phase, closes_at = recorded.window if recorded.window is not None else (None, None)
    return BetFacts(
        phase=phase,
        closes_at=closes_at,
        now=r.now,
        round_id=r.bet["round_id"],
        staked_minor=recorded.staked,
        round_bets=recorded.round_bets,
        player_bets=recorded.player_bets,
        player_open_bets=recorded.player_open_bets,
        bounds=r.bounds,
        one_bet_per_round=machine.one_bet_per_round,
    )


def refused(refusal: Refusal) -> BetRefused:
    """The refusal counted, as the error to raise."""
    BETS_REFUSED.labels(refusal.reason).inc()
    return refusal.error()


class Bets:
    def __init__(self, ctx: TableContext, machine_for: Callable[[Variant[Any]], RoundMachine]) -> None:
        self._ctx = ctx
        self._store = ctx.store
        self._machine_for = machine_for
        self._configs: dict[tuple[str, str, int], Any] = {}
        self._arrivals = itertools.count()
        self.groups = BetGroups(ctx.store)

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
        check_order(command_id, amount_minor, client_seed)
        player = player_account(who)
        bet_id = scoped_id(player, command_id)
        context = await self.groups.context(BetQuery(table_id, (bet_id, command_id), player))
        existing = own_bet(context.stored, bet_id, command_id, player)
        if existing is not None:
            return replay(existing, player, table_id, area, amount_minor)
        order = BetOrder(command_id, table_id, area, amount_minor, round_id, client_seed)
        admitted = await self._admit(order, bet_id, player, context)
        await self._hold(admitted.bet, admitted.closes_at)
        receipt = await self._record_held(admitted, client_seed, arrival)
        if not receipt.replayed:
            BETS.labels(admitted.variant_id, area).inc()
            BET_STAKES.labels(admitted.variant_id).inc(amount_minor)
            self._ctx.wake(table_id)
        return receipt

    async def _admit(self, order: BetOrder, bet_id: str, player: str, context: BetContext) -> Admitted:
        """A new bet checked against the table, its round and the player's bets there (checked again,
        atomically, when it is recorded)."""
        table, current = context.table, context.current
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
        machine = self._machine_for(variant)
        bounds = Bounds(limits_of(terms).max_bet_minor, MAX_BETS_PER_ROUND, MAX_BETS_PER_PLAYER_ROUND)
        refusal = verify_bet(facts_before_hold(context, self._ctx.now(), bounds, machine), order.admitted())
        if refusal is not None:
            raise refused(refusal)
        assert current is not None  # and so ``config`` and ``bounds`` are the round's
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
        return Admitted(bet, machine, bounds, variant.variant_id, current["betting_closes_at"])

    async def _record_held(self, admitted: Admitted, client_seed: str, arrival: int) -> BetReceipt:
        """Record a bet the wallet holds; its hold is voided when it is refused, or recorded by the same
        command sent twice at once (which recorded it with its own hold)."""
        bet = admitted.bet
        try:
            receipt = await self._record(admitted, client_seed, arrival)
        except (FailedPrecondition, RecordingBusy):
            # Refused after the wallet held: the bet rolled back, so its hold goes too.
            await self._ctx.wallet.void_hold(bet["hold_id"])
            raise
        if receipt.replayed:
            await self._ctx.wallet.void_hold(bet["hold_id"])
        return receipt

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

    def config_of(self, variant: Variant[Any], current: Row) -> Any:
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
        if staked + amount > limits.max_bet_minor:
            BETS_REFUSED.labels("ABOVE_TABLE_MAXIMUM").inc()
            raise FailedPrecondition(
                "ABOVE_TABLE_MAXIMUM",
                f"the table maximum is {limits.max_bet_minor} per player and round; {staked} already staked",
            )

    async def _record(self, admitted: Admitted, client_seed: str, arrival: int) -> BetReceipt:
        """The bet and its event (``BetGroups.record``). Not recorded, the facts the statement decided on
        name the refusal (``verify_bet``), unless the same command raced this one and recorded the bet."""
        bet = admitted.bet
        recording = Recording(bet, self._ctx.now(), client_seed, admitted.bounds, arrival)
        recorded = await self.groups.record(recording, admitted.machine)
        if recorded.inserted:
            return BetReceipt.of({**bet, "status": "placed"}, replayed=False)
        refusal = verify_bet(facts_recorded(recorded, recording, admitted.machine), Order(bet["stake_minor"]))
        if refusal is not None and refusal.reason == "BETTING_CLOSED":
            raise refused(Refusal(refusal.reason, "betting closed before the bet could be recorded"))
        async with self._store.read() as conn:
            existing = await self._store.bet(conn, bet["bet_id"])  # the same command raced
        if existing is not None:
            return replay(existing, bet["player"], bet["table_id"], bet["area"], bet["stake_minor"])
        if refusal is None:
            raise RuntimeError(f"bet {bet['bet_id']} not recorded on facts the admission takes: {recorded}")
        raise refused(refusal)  # the bets recorded meanwhile left no room for it

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
