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
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from google.protobuf.message import Message
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from backbone.auth import Principal, Role, require
from backbone.errors import AlreadyExists, DomainError, FailedPrecondition, InvalidArgument, NotFound
from backbone.eventstore import EventStore, NewEvent
from bull.rules import baibian_bull as bb
from services.table.baibian import BANKER_PARTY, BaibianTableConfig
from services.table.ports import WalletPort

log = logging.getLogger(__name__)

BANKED_VARIANTS = frozenset({bb.VARIANT_ID})
HOLD_GRACE = timedelta(hours=1)  # as a bet's hold: the round settles long before
# Every pass of the seating loop ends a tenure or seats a banker; a queue longer than this waits a round.
MAX_SEATING_STEPS = 1_000
MAX_QUEUE_LISTED = 1_000
# Waiting for the wallet to apply the previous round blocks the table's loop: well under its lease's TTL.
SETTLEMENT_PATIENCE_S = 2.0
SETTLEMENT_POLL_S = 0.05

DDL = (
    """
    CREATE TABLE IF NOT EXISTS banker_seats (
        table_id        TEXT PRIMARY KEY REFERENCES tables (table_id),
        player          TEXT,
        capital_minor   BIGINT NOT NULL DEFAULT 0,
        rounds_banked   INT NOT NULL DEFAULT 0,
        leaving         BOOLEAN NOT NULL DEFAULT false
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS banker_queue (
        table_id       TEXT NOT NULL REFERENCES tables (table_id),
        player         TEXT NOT NULL,
        capital_minor  BIGINT NOT NULL CHECK (capital_minor >= 0),
        seq            BIGSERIAL,
        applied_at     TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (table_id, player)
    )
    """,
    "CREATE INDEX IF NOT EXISTS banker_queue_order_idx ON banker_queue (table_id, seq)",
    """
    CREATE TABLE IF NOT EXISTS banked_rounds (
        round_id          TEXT PRIMARY KEY,
        table_id          TEXT NOT NULL REFERENCES tables (table_id),
        banker            TEXT,
        capital_minor     BIGINT NOT NULL CHECK (capital_minor >= 0),
        hold_id           TEXT,
        hold_expires_at   TIMESTAMPTZ,
        table_cap_minor   BIGINT NOT NULL CHECK (table_cap_minor >= 0),
        staked_minor      BIGINT NOT NULL DEFAULT 0,
        CHECK (staked_minor >= 0 AND staked_minor <= table_cap_minor)
    )
    """,
)


def is_banked(variant_id: str) -> bool:
    return variant_id in BANKED_VARIANTS


def banker_stream(table_id: str) -> str:
    return f"table-{table_id}.banker"


def unix_ms(moment: datetime | None) -> int:
    return int(moment.timestamp() * 1000) if moment else 0


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
class _Seat:
    player: str | None
    capital_minor: int
    rounds_banked: int
    leaving: bool


def table_config(table: Mapping[str, Any]) -> BaibianTableConfig:
    return BaibianTableConfig.from_settings(table["config"])


class BankerSeats:
    """The table application's banker hooks; each is a no-op for house-banked variants."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        store: EventStore,
        wallet: WalletPort,
        *,
        clock: Callable[[], datetime],
        notify: Callable[[str], Any] | None = None,
    ) -> None:
        self._pool = pool
        self._store = store
        self._wallet = wallet
        self._clock = clock
        self._notify = notify

    # ------------------------------------------------------------------ the queue

    async def apply(self, who: Principal, table_id: str, capital_minor: int) -> table_pb2.BankerQueue:
        require(who, Role.PLAYER)
        player = f"player:{who.subject}"
        if not 0 <= capital_minor <= 10**15:
            raise InvalidArgument("CAPITAL_INVALID", "capital_minor must be 0 (the whole balance) or positive")
        async with self._pool.connection() as conn, conn.transaction():
            table = await self._banked_table(conn, table_id)
            config = table_config(table)
            seat = await self._lock_seat(conn, table_id)
            if seat.player == player and not seat.leaving:
                return await self._queue(conn, table_id, config)  # already banking: nothing to do
            cur = await conn.execute(
                "SELECT capital_minor FROM banker_queue WHERE table_id = %s AND player = %s", (table_id, player)
            )
            queued = await cur.fetchone()
            if queued is not None:
                if int(queued[0]) != capital_minor:
                    raise AlreadyExists("BANKER_APPLICATION_EXISTS", "you are in the queue with another capital")
                return await self._queue(conn, table_id, config)
            if 0 < capital_minor < config.min_capital_minor:
                raise FailedPrecondition(
                    "BANKER_CAPITAL_TOO_LOW", f"a banker brings at least {config.min_capital_minor}"
                )
            available = await self._wallet.balance_minor(player)
            if min(available, capital_minor or available) < config.min_capital_minor:
                raise FailedPrecondition(
                    "BANKER_CAPITAL_TOO_LOW",
                    f"a banker needs {config.min_capital_minor} available; you have {available}",
                )
            await conn.execute(
                "INSERT INTO banker_queue (table_id, player, capital_minor, applied_at) VALUES (%s, %s, %s, %s)",
                (table_id, player, capital_minor, self._clock()),
            )
            applied = ev.BankerApplied(table_id=table_id, player=player, capital_minor=capital_minor)
            await self._append(conn, table_id, "table.banker_applied", applied, table_id)
            queue = await self._queue(conn, table_id, config)
        self._wake(table_id)
        return queue

    async def leave_banker(self, who: Principal, table_id: str, cause: str = "banker_left") -> table_pb2.BankerQueue:
        require(who, Role.PLAYER)
        async with self._pool.connection() as conn, conn.transaction():
            table = await self._banked_table(conn, table_id)
            await self._withdraw(conn, table_id, f"player:{who.subject}", cause)
            queue = await self._queue(conn, table_id, table_config(table))
        self._wake(table_id)
        return queue

    async def leave_table(self, who: Principal, table_id: str) -> None:
        """A player leaving a banked table leaves its queue; a seated banker leaves after this round."""
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute("SELECT variant FROM tables WHERE table_id = %s", (table_id,))
            row = await cur.fetchone()
            if row is None or not is_banked(row[0]):
                return
            await self._withdraw(conn, table_id, f"player:{who.subject}", "left_table")
        self._wake(table_id)

    async def queue(self, table_id: str) -> table_pb2.BankerQueue:
        async with self._pool.connection() as conn:
            table = await self._banked_table(conn, table_id)
            return await self._queue(conn, table_id, table_config(table))

    async def _withdraw(self, conn: psycopg.AsyncConnection, table_id: str, player: str, cause: str) -> None:
        seat = await self._lock_seat(conn, table_id)
        if seat.player == player:
            if not seat.leaving:
                await conn.execute("UPDATE banker_seats SET leaving = true WHERE table_id = %s", (table_id,))
                withdrew = ev.BankerWithdrew(table_id=table_id, player=player, cause=cause, seated=True)
                await self._append(conn, table_id, "table.banker_withdrew", withdrew, table_id)
            return
        cur = await conn.execute("DELETE FROM banker_queue WHERE table_id = %s AND player = %s", (table_id, player))
        if cur.rowcount:
            withdrew = ev.BankerWithdrew(table_id=table_id, player=player, cause=cause, seated=False)
            await self._append(conn, table_id, "table.banker_withdrew", withdrew, table_id)

    async def _queue(
        self, conn: psycopg.AsyncConnection, table_id: str, config: BaibianTableConfig
    ) -> table_pb2.BankerQueue:
        seat = await self._seat(conn, table_id)
        cur = await conn.execute(
            "SELECT player, capital_minor, applied_at FROM banker_queue WHERE table_id = %s ORDER BY seq LIMIT %s",
            (table_id, MAX_QUEUE_LISTED),
        )
        entries = [
            table_pb2.BankerQueueEntry(player=p, capital_minor=int(c), applied_at_unix_ms=unix_ms(at))
            for p, c, at in await cur.fetchall()
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

    async def prepare_round(self, table: Mapping[str, Any], round_id: str) -> RoundBanker | None:
        """Before a banked round opens: fix its banker and hold their capital (None for other variants)."""
        if not is_banked(table["variant"]):
            return None
        config = table_config(table)
        await self._previous_round_applied(table)
        for _ in range(MAX_SEATING_STEPS):
            plan = await self._plan(table, round_id, config)
            if plan.banker is None:
                return plan
            try:
                await self._wallet.place_hold(
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
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT b.round_id FROM banked_rounds b JOIN rounds r USING (round_id) WHERE r.table_id = %s"
                " AND r.round_no = %s AND b.banker IS NOT NULL AND r.phase IN ('settled', 'voided')",
                (table["table_id"], table["round_no"]),
            )
            row = await cur.fetchone()
        if row is None:
            return
        deadline = time.monotonic() + SETTLEMENT_PATIENCE_S
        while await self._wallet.settlement_status(row[0]) is None:
            if time.monotonic() > deadline:
                raise FailedPrecondition("BANKER_SETTLEMENT_PENDING", f"the wallet has not applied {row[0]} yet")
            await asyncio.sleep(SETTLEMENT_POLL_S)

    async def _plan(self, table: Mapping[str, Any], round_id: str, config: BaibianTableConfig) -> RoundBanker:
        table_id = table["table_id"]
        async with self._pool.connection() as conn, conn.transaction():
            seat = await self._lock_seat(conn, table_id)
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute("SELECT * FROM banked_rounds WHERE round_id = %s", (round_id,))
                existing = await cur.fetchone()
            if existing is not None:
                return RoundBanker.from_row(existing)  # a retried opening: the same banker and hold
            capital = await self._seat_banker(conn, table_id, round_id, seat, config)
            if seat.player is None:
                plan = RoundBanker(round_id, table_id, None, 0, "", None, 0)
            else:
                seat.rounds_banked += 1
                betting = timedelta(seconds=ev.TableLimits.FromString(table["limits"]).betting_seconds)
                expires = self._clock() + betting + HOLD_GRACE
                hold_id = f"banker.{round_id}.{seat.player.removeprefix('player:')}"
                cap = config.cap_minor(capital)
                plan = RoundBanker(round_id, table_id, seat.player, capital, hold_id, expires, cap)
            await conn.execute(
                "INSERT INTO banked_rounds (round_id, table_id, banker, capital_minor, hold_id, hold_expires_at,"
                " table_cap_minor) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (
                    round_id,
                    table_id,
                    plan.banker,
                    plan.capital_minor,
                    plan.hold_id or None,
                    plan.hold_expires_at,
                    plan.table_cap_minor,
                ),
            )
            await self._save_seat(conn, table_id, seat)
            return plan

    async def _seat_banker(
        self,
        conn: psycopg.AsyncConnection,
        table_id: str,
        round_id: str,
        seat: _Seat,
        config: BaibianTableConfig,
    ) -> int:
        """End the tenure if it is over, seat the first eligible in line; returns the banker's capital."""
        for _ in range(MAX_SEATING_STEPS):
            if seat.player is not None:
                reason = "left" if seat.leaving else "session_complete"
                if seat.leaving or seat.rounds_banked >= config.session_rounds:
                    await self._end_tenure(conn, table_id, round_id, seat, reason)
                    continue
                capital = await self._capital(seat)
                if capital >= config.min_capital_minor:
                    return capital
                detail = f"capital {capital} < {config.min_capital_minor}"
                await self._end_tenure(conn, table_id, round_id, seat, "capital_below_minimum", detail)
                continue
            cur = await conn.execute(
                "DELETE FROM banker_queue WHERE (table_id, player) = (SELECT table_id, player FROM banker_queue"
                " WHERE table_id = %s ORDER BY seq LIMIT 1 FOR UPDATE) RETURNING player, capital_minor",
                (table_id,),
            )
            head = await cur.fetchone()
            if head is None:
                return 0  # nobody to bank
            player: str = head[0]
            capital = await self._capital(_Seat(player, int(head[1]), 0, False))
            if capital < config.min_capital_minor:
                withdrew = ev.BankerWithdrew(
                    table_id=table_id, player=player, cause="capital_below_minimum", seated=False
                )
                await self._append(conn, table_id, "table.banker_withdrew", withdrew, round_id)
                continue
            seat.player, seat.capital_minor, seat.rounds_banked, seat.leaving = player, int(head[1]), 0, False
            seated = ev.BankerSeated(
                table_id=table_id,
                player=player,
                capital_minor=int(head[1]),
                round_id=round_id,
                session_rounds=config.session_rounds,
            )
            await self._append(conn, table_id, "table.banker_seated", seated, round_id)
            return capital
        return 0

    async def _capital(self, seat: _Seat) -> int:
        assert seat.player is not None
        try:
            available = await self._wallet.balance_minor(seat.player)
        except (NotFound, InvalidArgument):
            return 0
        return available if seat.capital_minor == 0 else min(seat.capital_minor, available)

    async def _end_tenure(
        self,
        conn: psycopg.AsyncConnection,
        table_id: str,
        round_id: str,
        seat: _Seat,
        reason: str,
        detail: str = "",
    ) -> None:
        assert seat.player is not None
        ended = ev.BankerTenureEnded(
            table_id=table_id, player=seat.player, reason=reason, rounds_banked=seat.rounds_banked, detail=detail
        )
        await self._append(conn, table_id, "table.banker_tenure_ended", ended, round_id or table_id)
        seat.player, seat.capital_minor, seat.rounds_banked, seat.leaving = None, 0, 0, False

    async def _drop_plan(self, plan: RoundBanker, refused: DomainError) -> None:
        """The wallet refused the banker's hold: the tenure ends and the round is planned again."""
        async with self._pool.connection() as conn, conn.transaction():
            seat = await self._lock_seat(conn, plan.table_id)
            await conn.execute(
                "DELETE FROM banked_rounds WHERE round_id = %s AND banker = %s", (plan.round_id, plan.banker)
            )
            if seat.player == plan.banker:
                seat.rounds_banked -= 1  # the round it was counted for will not be banked by them
                await self._end_tenure(conn, plan.table_id, plan.round_id, seat, "hold_refused", str(refused))
                await self._save_seat(conn, plan.table_id, seat)

    @staticmethod
    def stamp_opened(opened: ev.RoundOpened, plan: RoundBanker | None) -> None:
        """Announce the round's banker, capital, hold and table cap on its RoundOpened."""
        if plan is None or plan.banker is None:
            return
        opened.banker = plan.banker
        opened.banker_capital_minor = plan.capital_minor
        opened.banker_hold_id = plan.hold_id
        opened.table_cap_minor = plan.table_cap_minor

    async def round_banker(self, conn: psycopg.AsyncConnection, round_id: str) -> RoundBanker | None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT * FROM banked_rounds WHERE round_id = %s", (round_id,))
            row = await cur.fetchone()
        return RoundBanker.from_row(row) if row else None

    # ------------------------------------------------------------------ bets

    async def check_bet(
        self, conn: psycopg.AsyncConnection, variant_id: str, config: Any, round_id: str, player: str, amount: int
    ) -> None:
        """Before the wallet is asked to hold: a banker to bet against, whole chips, room under the table cap."""
        if not is_banked(variant_id):
            return
        assert isinstance(config, BaibianTableConfig)
        plan = await self.round_banker(conn, round_id)
        if plan is None or plan.banker is None:
            raise FailedPrecondition("NO_BANKER", "nobody banks this round: betting is closed until a banker sits")
        if plan.banker == player:
            raise FailedPrecondition("BANKER_CANNOT_BET", "the banker does not bet against their own seat")
        if amount % config.min_chip_minor:
            raise InvalidArgument("NOT_A_CHIP_AMOUNT", f"a bet is made of chips: a multiple of {config.min_chip_minor}")
        cur = await conn.execute("SELECT staked_minor FROM banked_rounds WHERE round_id = %s", (round_id,))
        row = await cur.fetchone()
        staked = int(row[0]) if row else 0
        if staked + amount > plan.table_cap_minor:
            raise _table_cap_reached(plan, staked)

    async def reserve(
        self, conn: psycopg.AsyncConnection, round_id: str, player: str, amount: int, hold_id: str
    ) -> None:
        """In the bet's transaction: count the stake against the table cap, atomically (see the module docstring).

        A refused bet was already held by the wallet: its hold is voided here, before the
        refusal rolls the bet back (the wallet answers a repeated void as the first).
        """
        try:
            await self._count_stake(conn, round_id, player, amount)
        except DomainError:
            await self._wallet.void_hold(hold_id)
            raise

    async def _count_stake(self, conn: psycopg.AsyncConnection, round_id: str, player: str, amount: int) -> None:
        cur = await conn.execute(
            "UPDATE banked_rounds SET staked_minor = staked_minor + %s WHERE round_id = %s AND banker IS NOT NULL"
            " AND banker <> %s AND staked_minor + %s <= table_cap_minor RETURNING staked_minor",
            (amount, round_id, player, amount),
        )
        if await cur.fetchone() is not None:
            return
        plan = await self.round_banker(conn, round_id)
        if plan is None:
            return  # not a banked round
        if plan.banker is None:
            raise FailedPrecondition("NO_BANKER", "nobody banks this round")
        if plan.banker == player:
            raise FailedPrecondition("BANKER_CANNOT_BET", "the banker does not bet against their own seat")
        cur = await conn.execute("SELECT staked_minor FROM banked_rounds WHERE round_id = %s", (round_id,))
        row = await cur.fetchone()
        raise _table_cap_reached(plan, int(row[0]) if row else 0)

    async def release(self, conn: psycopg.AsyncConnection, round_id: str, amount: int) -> None:
        """A cancelled or refunded bet gives its room under the table cap back."""
        await conn.execute(
            "UPDATE banked_rounds SET staked_minor = staked_minor - %s WHERE round_id = %s", (amount, round_id)
        )

    # ------------------------------------------------------------------ settlement

    async def fund_settlement(self, conn: psycopg.AsyncConnection, round_id: str, settled: ev.RoundSettled) -> None:
        """Name the banker's account and hold in a banked round's settlement, and list the hold."""
        plan = await self.round_banker(conn, round_id)
        if plan is None or plan.banker is None:
            assert not any(BANKER_PARTY in (t.payer, t.payee) for t in settled.transfers), "a bet with no banker"
            return
        for transfer in settled.transfers:
            assert plan.banker not in (transfer.payer, transfer.payee), "the banker bet against their own seat"
            if transfer.payer == BANKER_PARTY:
                transfer.payer = plan.banker
                transfer.hold_id = plan.hold_id
            if transfer.payee == BANKER_PARTY:
                transfer.payee = plan.banker
        settled.hold_ids.append(plan.hold_id)

    async def fund_void(self, conn: psycopg.AsyncConnection, round_id: str, voided: ev.RoundVoided) -> None:
        """A voided banked round releases the banker's hold with the bettors'."""
        plan = await self.round_banker(conn, round_id)
        if plan is not None and plan.banker is not None:
            voided.hold_ids.append(plan.hold_id)

    # ------------------------------------------------------------------ watching

    async def with_allowance(
        self, updates: AsyncIterator[table_pb2.TableUpdate], who: Principal, table: Mapping[str, Any]
    ) -> AsyncIterator[table_pb2.TableUpdate]:
        """``updates`` with the watcher's BetAllowance after each opening and each bet at a banked table."""
        banked = is_banked(table["variant"])
        allowance = Allowance(self, f"player:{who.subject}", table_config(table)) if banked else None
        async for update in updates:
            yield update
            if allowance is not None:
                extra = await allowance.fold(update)
                if extra is not None:
                    yield extra

    async def allowance_facts(self, round_id: str, player: str) -> tuple[RoundBanker | None, int, int, int]:
        """(round banker, table staked, player's staked, player's held) from the rows, for a watcher resuming."""
        async with self._pool.connection() as conn:
            plan = await self.round_banker(conn, round_id)
            cur = await conn.execute(
                "SELECT coalesce(max(staked_minor), 0) FROM banked_rounds WHERE round_id = %s", (round_id,)
            )
            row = await cur.fetchone()
            cur = await conn.execute(
                "SELECT coalesce(sum(stake_minor), 0), coalesce(sum(hold_minor), 0) FROM bets"
                " WHERE round_id = %s AND player = %s AND status = 'placed'",
                (round_id, player),
            )
            mine = await cur.fetchone()
        assert row is not None and mine is not None
        return plan, int(row[0]), int(mine[0]), int(mine[1])

    async def available_minor(self, player: str) -> int:
        try:
            return await self._wallet.balance_minor(player)
        except DomainError:
            return 0

    # ------------------------------------------------------------------ rows and events

    async def _banked_table(self, conn: psycopg.AsyncConnection, table_id: str) -> dict[str, Any]:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT * FROM tables WHERE table_id = %s", (table_id,))
            table = await cur.fetchone()
        if table is None:
            raise NotFound("TABLE_NOT_FOUND", f"no table {table_id}")
        if not is_banked(table["variant"]):
            raise FailedPrecondition("TABLE_NOT_BANKED", f"table {table_id} ({table['variant']}) has no banker seat")
        return table

    async def _lock_seat(self, conn: psycopg.AsyncConnection, table_id: str) -> _Seat:
        await conn.execute("INSERT INTO banker_seats (table_id) VALUES (%s) ON CONFLICT DO NOTHING", (table_id,))
        return await self._seat(conn, table_id, lock=True)

    async def _seat(self, conn: psycopg.AsyncConnection, table_id: str, *, lock: bool = False) -> _Seat:
        cur = await conn.execute(
            "SELECT player, capital_minor, rounds_banked, leaving FROM banker_seats WHERE table_id = %s"
            + (" FOR UPDATE" if lock else ""),
            (table_id,),
        )
        row = await cur.fetchone()
        if row is None:
            return _Seat(None, 0, 0, False)
        return _Seat(row[0], int(row[1]), int(row[2]), bool(row[3]))

    async def _save_seat(self, conn: psycopg.AsyncConnection, table_id: str, seat: _Seat) -> None:
        await conn.execute(
            "UPDATE banker_seats SET player = %s, capital_minor = %s, rounds_banked = %s, leaving = %s"
            " WHERE table_id = %s",
            (seat.player, seat.capital_minor, seat.rounds_banked, seat.leaving, table_id),
        )

    async def _append(
        self, conn: psycopg.AsyncConnection, table_id: str, event_type: str, payload: Message, correlation_id: str
    ) -> None:
        """Append to the table's banker stream; callers hold the seat row's lock, so appends never race."""
        stream = banker_stream(table_id)
        version = await self._store.stream_version(conn, stream)
        await self._store.append(conn, stream, version, [NewEvent(event_type, payload, correlation_id=correlation_id)])

    def _wake(self, table_id: str) -> None:
        if self._notify is not None:
            self._notify(table_id)


def _table_cap_reached(plan: RoundBanker, staked: int) -> FailedPrecondition:
    return FailedPrecondition(
        "TABLE_CAP_REACHED",
        f"the table's stakes may total {plan.table_cap_minor} (banker capital / 10); {staked} is staked",
    )


class Allowance:
    """Folds one watcher's updates into what they may still bet (GAME_RULES §2 "可下注數")."""

    def __init__(self, seats: BankerSeats, player: str, config: BaibianTableConfig) -> None:
        self._seats = seats
        self._player = player
        self._config = config
        self.round_id = ""
        self.banker = ""
        self.banker_capital = 0
        self.table_cap = 0
        self.table_staked = 0
        self.my_staked = 0
        self.my_held = 0
        self.available = 0
        self.betting = False
        self._mine: dict[str, tuple[int, int]] = {}

    async def fold(self, update: table_pb2.TableUpdate) -> table_pb2.TableUpdate | None:
        kind = update.WhichOneof("update")
        if kind == "round_opened":
            opened = update.round_opened
            self._start(update.round_id, opened.banker, opened.banker_capital_minor, opened.table_cap_minor)
            self.betting = True
            await self._refresh_capital()
            return self._update(update)
        if update.round_id and update.round_id != self.round_id:
            await self._resume(update.round_id)
        if kind == "my_bet_placed":
            placed = update.my_bet_placed
            self._mine[placed.bet_id] = (placed.stake_minor, placed.hold_minor)
            await self._refresh_capital()
        elif kind == "my_bet_cancelled":
            self._mine.pop(update.my_bet_cancelled.bet_id, None)
            await self._refresh_capital()
        elif kind == "area_totals":
            self.table_staked = sum(update.area_totals.totals_minor.values())
            return self._update(update) if self.betting else None
        elif kind == "phase_changed":
            self.betting = False
        return None

    def _start(self, round_id: str, banker: str, capital: int, cap: int) -> None:
        self.round_id, self.banker, self.banker_capital, self.table_cap = round_id, banker, capital, cap
        self.table_staked = 0
        self._mine.clear()

    async def _resume(self, round_id: str) -> None:
        """A watcher that resumed mid-round missed its opening: read the round's facts from the rows."""
        plan, table_staked, my_staked, my_held = await self._seats.allowance_facts(round_id, self._player)
        banker = plan.banker if plan and plan.banker else ""
        self._start(round_id, banker, plan.capital_minor if plan else 0, plan.table_cap_minor if plan else 0)
        self.table_staked = table_staked
        self._mine["(earlier)"] = (my_staked, my_held)
        self.betting = True
        await self._refresh_capital()

    async def _refresh_capital(self) -> None:
        self.available = await self._seats.available_minor(self._player)

    def _update(self, source: table_pb2.TableUpdate) -> table_pb2.TableUpdate:
        my_staked = sum(stake for stake, _ in self._mine.values())
        my_held = sum(held for _, held in self._mine.values())
        capital = self.available + my_held
        my_cap = min(self._config.cap_minor(capital), self._config.cap_minor(self.banker_capital))
        open_ = bool(self.banker) and self.banker != self._player
        room = max(0, min(my_cap - my_staked, self.table_cap - self.table_staked)) if open_ else 0
        chip = self._config.min_chip_minor
        allowance = table_pb2.BetAllowance(
            betting_open=open_,
            available_to_bet_minor=room // chip * chip,
            my_cap_minor=my_cap,
            my_staked_minor=my_staked,
            table_cap_minor=self.table_cap,
            table_staked_minor=self.table_staked,
            player_capital_minor=capital,
            banker_capital_minor=self.banker_capital,
            banker=self.banker,
        )
        return table_pb2.TableUpdate(
            position=source.position, table_id=source.table_id, round_id=source.round_id, bet_allowance=allowance
        )
