"""The banker seat of banked variants (百變牛牛): queue, tenure, the banker's hold, the caps.

A player banks instead of the house. The table keeps, per banked table, one seat
row (``banker_seats``: who banks, since when, leaving or not) and a first-come
queue (``banker_queue``); per round, a ``banked_rounds`` row fixes who banks it,
with what capital, under which wallet hold, and counts the stakes against the
table's cap. Banker events go on the stream ``table-<id>.banker`` (WatchTable
reads it with the table's), every append under the seat row's lock.

Money, and why the banker can always pay:

* At a round's opening the first eligible banker (the seated one, else the
  first in line) is checked: a tenure ends after ``banker.session_rounds``
  rounds, when the banker asked to leave, or when their capital is below
  ``banker.min_capital_minor``. Banker capital = the capital they applied with
  (0 = all) capped by their available balance; the wallet holds all of it for
  the round (hold ``banker.<round id>.<player id>``) before the round opens.
  The plan is stored before the hold is asked for, so a retried opening asks
  for the same hold (the wallet answers a repeat as the first).
* The table's total of all stakes is capped at banker capital / 10 (1 / the
  highest multiplier). A bettor wins at most stake x 10, so the winners of a
  round can never be owed more than the banker's hold; every transfer the
  banker pays names that hold, and the settlement lists it, so the wallet
  releases the rest (or the whole of it when the round is voided).
* A player's total may not pass one tenth of min(player capital, banker
  capital). Player capital = available balance + what the wallet holds for the
  player's bets of this round (the balance before this round's bets). Each bet
  holds stake x 10, so the player-capital half of the cap is exactly the
  wallet's refusal of a hold beyond the available balance (atomic in the
  wallet); the banker-capital half is implied by the table cap.
* The table cap is enforced in the transaction that records the bet, after the
  wallet has held it: one conditional ``UPDATE banked_rounds SET staked = staked
  + x WHERE staked + x <= cap``. Concurrent bets serialize on that row, each
  sees the others' committed stakes, and only bets actually recorded count, so
  no bet is refused when it would have fit (a refused bet's hold is voided).

With nobody to bank, rounds still open, deal and show, but ``PlaceBet`` is
refused with ``NO_BANKER``. The banker's own round always settles normally:
leaving (``LeaveBanker`` or ``LeaveTable``) takes effect at the next opening.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from google.protobuf.message import Message
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2

from backbone.auth import Principal, Role, require
from backbone.errors import AlreadyExists, DomainError, FailedPrecondition, InvalidArgument, NotFound
from backbone.lease import check_fence
from bull.variants import RoundShape, get
from bull.variants.baibian_bull import BaibianTableConfig
from services.table.banker_store import RoundBanker, Seat
from services.table.common import HOLD_GRACE, banker_stream, player_account, unix_ms
from services.table.context import TableContext
from services.table.store import Conn, Row

log = logging.getLogger(__name__)

# Every pass of the seating loop ends a tenure or seats a banker; a queue longer than this waits a round.
MAX_SEATING_STEPS = 1_000
# Balances of the queue read before a seating when the banker does not stay: the first usually takes the seat.
PREFETCHED_QUEUED = 2
# Waiting for the wallet to apply the previous round blocks the table's loop: well under its lease's TTL.
SETTLEMENT_PATIENCE_S = 2.0
SETTLEMENT_POLL_S = 0.05


Balances = dict[str, int | DomainError]
"""Players' available balances read before a seating (or the wallet's refusal to tell)."""


class StakeRefused(FailedPrecondition):
    """``reserve`` refused a bet the wallet already holds: the caller voids the hold once the bet's
    transaction has rolled back."""


class _Unfetched(Exception):
    """The seating needs a balance that was not read before its transaction: roll back, read it, plan again."""

    def __init__(self, player: str) -> None:
        super().__init__(player)
        self.player = player


def is_banked(variant_id: str) -> bool:
    return get(variant_id).shape is RoundShape.BANKER_SEAT


def table_config(table: Mapping[str, Any]) -> BaibianTableConfig:
    config = get(table["variant"]).parse_config(table["config"])
    assert isinstance(config, BaibianTableConfig)
    return config


class BankerSeats:
    """The banker seat of banked tables: the queue, tenures, each round's banker and their hold."""

    def __init__(self, ctx: TableContext) -> None:
        self._ctx = ctx
        self._seats = ctx.bankers

    # ------------------------------------------------------------------ the queue

    async def apply(self, who: Principal, table_id: str, capital_minor: int) -> table_pb2.BankerQueue:
        require(who, Role.PLAYER)
        player = player_account(who)
        if not 0 <= capital_minor <= 10**15:
            raise InvalidArgument("CAPITAL_INVALID", "capital_minor must be 0 (the whole balance) or positive")
        # Read before the seat is locked (no remote call under a row lock); its error, if any, is
        # raised where the balance is used, so an answer that does not need it is unchanged.
        available = await self._balance(player)
        async with self._ctx.store.transaction() as conn:
            table = await self._banked_table(conn, table_id)
            config = table_config(table)
            seat = await self._seats.lock_seat(conn, table_id)
            if seat.player == player and not seat.leaving:
                return await self._queue(conn, table_id, config)  # already banking: nothing to do
            queued = await self._seats.queued_capital(conn, table_id, player)
            if queued is not None:
                if queued != capital_minor:
                    raise AlreadyExists("BANKER_APPLICATION_EXISTS", "you are in the queue with another capital")
                return await self._queue(conn, table_id, config)
            if 0 < capital_minor < config.min_capital_minor:
                raise FailedPrecondition(
                    "BANKER_CAPITAL_TOO_LOW", f"a banker brings at least {config.min_capital_minor}"
                )
            if isinstance(available, DomainError):
                raise available
            if min(available, capital_minor or available) < config.min_capital_minor:
                raise FailedPrecondition(
                    "BANKER_CAPITAL_TOO_LOW",
                    f"a banker needs {config.min_capital_minor} available; you have {available}",
                )
            await self._seats.enqueue(conn, table_id, player, capital_minor, self._ctx.now())
            applied = ev.BankerApplied(table_id=table_id, player=player, capital_minor=capital_minor)
            await self._append(conn, table_id, "table.banker_applied", applied, table_id)
            queue = await self._queue(conn, table_id, config)
        self._ctx.wake(table_id)
        return queue

    async def leave_banker(self, who: Principal, table_id: str, cause: str = "banker_left") -> table_pb2.BankerQueue:
        require(who, Role.PLAYER)
        async with self._ctx.store.transaction() as conn:
            table = await self._banked_table(conn, table_id)
            await self._withdraw(conn, table_id, player_account(who), cause)
            queue = await self._queue(conn, table_id, table_config(table))
        self._ctx.wake(table_id)
        return queue

    async def leave_table(self, who: Principal, table_id: str) -> None:
        """A player leaving a banked table leaves its queue; a seated banker leaves after this round."""
        async with self._ctx.store.transaction() as conn:
            variant = await self._ctx.store.variant_of_table(conn, table_id)
            if variant is None or not is_banked(variant):
                return
            await self._withdraw(conn, table_id, player_account(who), "left_table")
        self._ctx.wake(table_id)

    async def queue(self, table_id: str) -> table_pb2.BankerQueue:
        async with self._ctx.store.read() as conn:
            table = await self._banked_table(conn, table_id)
            return await self._queue(conn, table_id, table_config(table))

    async def _withdraw(self, conn: Conn, table_id: str, player: str, cause: str) -> None:
        seat = await self._seats.lock_seat(conn, table_id)
        if seat.player == player:
            if not seat.leaving:
                await self._seats.set_leaving(conn, table_id)
                withdrew = ev.BankerWithdrew(table_id=table_id, player=player, cause=cause, seated=True)
                await self._append(conn, table_id, "table.banker_withdrew", withdrew, table_id)
            return
        if await self._seats.dequeue(conn, table_id, player):
            withdrew = ev.BankerWithdrew(table_id=table_id, player=player, cause=cause, seated=False)
            await self._append(conn, table_id, "table.banker_withdrew", withdrew, table_id)

    async def _queue(self, conn: Conn, table_id: str, config: BaibianTableConfig) -> table_pb2.BankerQueue:
        seat = await self._seats.seat(conn, table_id)
        entries = [
            table_pb2.BankerQueueEntry(player=p, capital_minor=c, applied_at_unix_ms=unix_ms(at))
            for p, c, at in await self._seats.queue(conn, table_id)
        ]
        return table_pb2.BankerQueue(
            table_id=table_id,
            banker=seat.player or "",
            banker_capital_minor=seat.capital_minor if seat.player else 0,
            rounds_banked=seat.rounds_banked if seat.player else 0,
            session_rounds=config.session_rounds,
            leaving=seat.leaving,
            queue=entries,
            min_capital_minor=config.min_capital_minor,
            chips_minor=config.chips_minor,
        )

    # ------------------------------------------------------------------ a round's banker

    async def prepare_round(self, table: Mapping[str, Any], round_id: str) -> RoundBanker:
        """Before a banked round opens: fix its banker and hold their capital (``banker`` None: nobody banks)."""
        config = table_config(table)
        await self._previous_round_applied(table)
        for _ in range(MAX_SEATING_STEPS):
            plan = await self._plan(table, round_id, config)
            if plan.banker is None:
                return plan
            try:
                await self._ctx.wallet.place_hold(
                    plan.hold_id,
                    plan.banker,
                    plan.capital_minor,
                    "banker capital",
                    round_id,
                    unix_ms(plan.hold_expires_at),
                )
                return plan
            except (FailedPrecondition, AlreadyExists, InvalidArgument, NotFound) as refused:
                # The balance moved since it was read, or the wallet will not let this player stake now.
                log.warning("banker hold refused", extra={"round_id": round_id, "error": str(refused)})
                await self._drop_plan(plan, refused)
        raise FailedPrecondition("BANKER_SEATING_STUCK", f"could not seat a banker for {round_id}")

    async def _previous_round_applied(self, table: Mapping[str, Any]) -> None:
        """Wait (briefly) until the wallet has applied the previous banked round's settlement.

        Until then its banker's hold is still held and every player's last stakes
        are unsettled: balances read now would understate capital (a banker with
        everything on the table would seem to have nothing). Raises
        BANKER_SETTLEMENT_PENDING after ``SETTLEMENT_PATIENCE_S``: the round
        runner retries the opening shortly.
        """
        previous = await self._seats.previous_banked_round(table["table_id"], table["round_no"])
        if previous is None:
            return
        deadline = time.monotonic() + SETTLEMENT_PATIENCE_S
        while await self._ctx.wallet.settlement_status(previous) is None:
            if time.monotonic() > deadline:
                raise FailedPrecondition("BANKER_SETTLEMENT_PENDING", f"the wallet has not applied {previous} yet")
            await self._ctx.sleep(SETTLEMENT_POLL_S)

    async def _plan(self, table: Mapping[str, Any], round_id: str, config: BaibianTableConfig) -> RoundBanker:
        """Fix the round's banker. The balances it needs are read before the seat is locked (no remote
        call under a row lock): the seated banker's, and the first in line's when that banker does not
        stay; when the seating needs one more (the queue changed, or those were not eligible) it rolls
        back, reads it, and plans again."""
        table_id = table["table_id"]
        balances: Balances = {}
        missing: str | None = None
        for _ in range(MAX_SEATING_STEPS):
            await self._prefetch(table_id, config, balances, missing)
            try:
                return await self._plan_with(table, round_id, config, balances)
            except _Unfetched as unfetched:
                missing = unfetched.player
        raise FailedPrecondition("BANKER_SEATING_STUCK", f"could not seat a banker for {round_id}")

    async def _prefetch(
        self, table_id: str, config: BaibianTableConfig, balances: Balances, missing: str | None
    ) -> None:
        """Read (without a lock) the balances the seating will likely need and has not read yet: ``missing``,
        the seated banker's, and, unless that banker stays on, the next ``PREFETCHED_QUEUED`` in line's."""
        async with self._ctx.store.read() as conn:
            seat = await self._seats.seat(conn, table_id)
            queue = await self._seats.queue(conn, table_id)
        stays = seat.player is not None and not seat.leaving and seat.rounds_banked < config.session_rounds
        wanted = [p for p in dict.fromkeys((missing, seat.player)) if p is not None and p not in balances]
        if missing is not None or not stays:
            wanted += [p for p, _, _ in queue if p not in balances and p not in wanted][:PREFETCHED_QUEUED]
        for player, balance in zip(wanted, await asyncio.gather(*map(self._balance, wanted)), strict=True):
            balances[player] = balance

    async def _balance(self, player: str) -> int | DomainError:
        """The player's available balance, or the wallet's refusal to tell (raised where it is needed)."""
        try:
            return await self._ctx.wallet.balance_minor(player)
        except DomainError as error:
            return error

    async def _plan_with(
        self, table: Mapping[str, Any], round_id: str, config: BaibianTableConfig, balances: Balances
    ) -> RoundBanker:
        table_id = table["table_id"]
        async with self._ctx.store.transaction() as conn:
            await check_fence(conn)  # the runner's work: a superseded owner seats nobody, holds nothing
            seat = await self._seats.lock_seat(conn, table_id)
            existing = await self._seats.round_banker(conn, round_id)
            if existing is not None:
                return existing  # a retried opening: the same banker and hold
            capital = await self._seat_banker(conn, table_id, round_id, seat, config, balances)
            if seat.player is None:
                plan = RoundBanker(round_id, table_id, None, 0, "", None, 0)
            else:
                seat.rounds_banked += 1
                betting = timedelta(seconds=ev.TableLimits.FromString(table["limits"]).betting_seconds)
                expires = self._ctx.now() + betting + HOLD_GRACE
                hold_id = f"banker.{round_id}.{seat.player.removeprefix('player:')}"
                cap = config.cap_minor(capital)
                plan = RoundBanker(round_id, table_id, seat.player, capital, hold_id, expires, cap)
            await self._seats.insert_round_banker(conn, plan)
            await self._seats.save_seat(conn, table_id, seat)
            return plan

    async def _seat_banker(
        self, conn: Conn, table_id: str, round_id: str, seat: Seat, config: BaibianTableConfig, balances: Balances
    ) -> int:
        """End the tenure if it is over, seat the first eligible in line; returns the banker's capital."""
        for _ in range(MAX_SEATING_STEPS):
            if seat.player is not None:
                reason = "left" if seat.leaving else "session_complete"
                if seat.leaving or seat.rounds_banked >= config.session_rounds:
                    await self._end_tenure(conn, table_id, round_id, seat, reason)
                    continue
                capital = _capital(seat, balances)
                if capital >= config.min_capital_minor:
                    return capital
                detail = f"capital {capital} < {config.min_capital_minor}"
                await self._end_tenure(conn, table_id, round_id, seat, "capital_below_minimum", detail)
                continue
            head = await self._seats.pop_head(conn, table_id)
            if head is None:
                return 0  # nobody to bank
            player, applied_capital = head
            capital = _capital(Seat(player, applied_capital, 0, False), balances)
            if capital < config.min_capital_minor:
                withdrew = ev.BankerWithdrew(
                    table_id=table_id, player=player, cause="capital_below_minimum", seated=False
                )
                await self._append(conn, table_id, "table.banker_withdrew", withdrew, round_id)
                continue
            seat.player, seat.capital_minor, seat.rounds_banked, seat.leaving = player, applied_capital, 0, False
            seated = ev.BankerSeated(
                table_id=table_id,
                player=player,
                capital_minor=applied_capital,
                round_id=round_id,
                session_rounds=config.session_rounds,
            )
            await self._append(conn, table_id, "table.banker_seated", seated, round_id)
            return capital
        return 0

    async def _end_tenure(
        self, conn: Conn, table_id: str, round_id: str, seat: Seat, reason: str, detail: str = ""
    ) -> None:
        assert seat.player is not None
        ended = ev.BankerTenureEnded(
            table_id=table_id, player=seat.player, reason=reason, rounds_banked=seat.rounds_banked, detail=detail
        )
        await self._append(conn, table_id, "table.banker_tenure_ended", ended, round_id or table_id)
        seat.player, seat.capital_minor, seat.rounds_banked, seat.leaving = None, 0, 0, False

    async def _drop_plan(self, plan: RoundBanker, refused: DomainError) -> None:
        """The wallet refused the banker's hold: the tenure ends and the round is planned again."""
        async with self._ctx.store.transaction() as conn:
            await check_fence(conn)
            seat = await self._seats.lock_seat(conn, plan.table_id)
            await self._seats.drop_round_banker(conn, plan.round_id, plan.banker)
            if seat.player == plan.banker:
                seat.rounds_banked -= 1  # the round it was counted for will not be banked by them
                await self._end_tenure(conn, plan.table_id, plan.round_id, seat, "hold_refused", str(refused))
                await self._seats.save_seat(conn, plan.table_id, seat)

    # ------------------------------------------------------------------ bets

    async def check_bet(self, conn: Conn, config: Any, round_id: str, player: str, amount: int) -> None:
        """Before the wallet is asked to hold: a banker to bet against, whole chips, room under the table cap."""
        assert isinstance(config, BaibianTableConfig)
        plan = await self._seats.round_banker(conn, round_id)
        if plan is None or plan.banker is None:
            raise FailedPrecondition("NO_BANKER", "nobody banks this round: betting is closed until a banker sits")
        if plan.banker == player:
            raise FailedPrecondition("BANKER_CANNOT_BET", "the banker does not bet against their own seat")
        if amount % config.min_chip_minor:
            raise InvalidArgument("NOT_A_CHIP_AMOUNT", f"a bet is made of chips: a multiple of {config.min_chip_minor}")
        staked = await self._seats.staked_minor(conn, round_id)
        if staked + amount > plan.table_cap_minor:
            raise _table_cap_reached(plan, staked)

    async def reserve(self, conn: Conn, round_id: str, player: str, amount: int, hold_id: str) -> None:
        """In the bet's transaction: count the stake against the table cap, atomically (see the module docstring).

        A refused bet was already held by the wallet: the refusal (``StakeRefused``) rolls the bet
        back, then the caller voids its hold, outside the transaction (no remote call under a row
        lock; the wallet answers a repeated void as the first).
        """
        if await self._seats.count_stake(conn, round_id, player, amount):
            return
        plan = await self._seats.round_banker(conn, round_id)
        if plan is None:
            return  # not a banked round
        if plan.banker is None:
            raise StakeRefused("NO_BANKER", "nobody banks this round")
        if plan.banker == player:
            raise StakeRefused("BANKER_CANNOT_BET", "the banker does not bet against their own seat")
        raise _table_cap_reached(plan, await self._seats.staked_minor(conn, round_id), StakeRefused)

    async def release(self, conn: Conn, round_id: str, amount: int) -> None:
        """A cancelled or refunded bet gives its room under the table cap back."""
        await self._seats.release(conn, round_id, amount)

    # ------------------------------------------------------------------ settlement

    async def round_banker(self, conn: Conn, round_id: str) -> RoundBanker | None:
        return await self._seats.round_banker(conn, round_id)

    # ------------------------------------------------------------------ rows and events

    async def _banked_table(self, conn: Conn, table_id: str) -> Row:
        table = await self._ctx.store.table(conn, table_id)
        if not is_banked(table["variant"]):
            raise FailedPrecondition("TABLE_NOT_BANKED", f"table {table_id} ({table['variant']}) has no banker seat")
        return table

    async def _append(self, conn: Conn, table_id: str, event_type: str, payload: Message, correlation_id: str) -> None:
        """Append to the table's banker stream; callers hold the seat row's lock, so appends never race."""
        await self._ctx.store.append(conn, banker_stream(table_id), event_type, payload, correlation_id=correlation_id)


def stamp_opened(opened: ev.RoundOpened, plan: RoundBanker) -> None:
    """Announce the round's banker, capital, hold and table cap on its RoundOpened."""
    if plan.banker is None:
        return
    opened.banker = plan.banker
    opened.banker_capital_minor = plan.capital_minor
    opened.banker_hold_id = plan.hold_id
    opened.table_cap_minor = plan.table_cap_minor


def _capital(seat: Seat, balances: Balances) -> int:
    """Banker capital: the capital applied with (0 = all) capped by the available balance read before."""
    assert seat.player is not None
    if seat.player not in balances:
        raise _Unfetched(seat.player)
    available = balances[seat.player]
    if isinstance(available, (NotFound, InvalidArgument)):
        return 0
    if isinstance(available, DomainError):
        raise available
    return available if seat.capital_minor == 0 else min(seat.capital_minor, available)


def _table_cap_reached(
    plan: RoundBanker, staked: int, error: type[FailedPrecondition] = FailedPrecondition
) -> FailedPrecondition:
    return error(
        "TABLE_CAP_REACHED",
        f"the table's stakes may total {plan.table_cap_minor} (banker capital / 10); {staked} is staked",
    )
