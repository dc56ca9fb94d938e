"""The table application: tables, bets and the round lifecycle.

Each command is load -> decide -> save: read the rows, check the rules, then write
rows and events in one transaction. The round lifecycle advances one step at a
time (``step``), every step re-reading the round under a row lock, so a restarted
or competing owner can never apply a step twice, and every deadline is stored, so
a restart resumes where the round was.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

import psycopg
from google.protobuf.message import Message
from niuniu.table.v1 import events_pb2 as ev
from prometheus_client import Counter
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from backbone.auth import Principal, Role, require
from backbone.errors import AlreadyExists, DomainError, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from backbone.eventstore import EventStore, NewEvent
from bull.cards import parse_cards
from bull.money import JACKPOT_POOL, Settlement
from bull.rules._config import ConfigError
from services.table.baibian import annotate_dealt
from services.table.banker import BankerSeats
from services.table.common import (
    COMMAND_ID,
    MAX_STAKE_MINOR,
    ROUNDS,
    SETTLEMENT_SECONDS,
    BetReceipt,
    Phase,
    bet_stream,
    player_account,
    settlement_event,
    table_stream,
    unix_ms,
)
from services.table.envelope import EnvelopeRounds, OneBetPerRound, default_limits, is_envelope
from services.table.jackpot import JackpotPool, PoolView
from services.table.ports import RngPort, WalletPort
from services.table.variants import VARIANTS, SeatHand, TableBet, Variant, decimal_text, reveal_steps

log = logging.getLogger(__name__)

TABLE_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
HOLD_GRACE = timedelta(hours=1)
SEED_REVEAL_PATIENCE = timedelta(seconds=30)
OVERDUE_REVEALS_PER_STEP = 3
RNG_DRAW_ATTEMPTS = 20

DEFAULT_LIMITS = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=1_000_000,
    chips_minor=[100, 500, 1_000, 5_000, 10_000, 50_000],
    betting_seconds=15,
    reveal_interval_ms=1_000,
    pause_between_rounds_ms=3_000,
)

BETS = Counter("niuniu_table_bets_total", "Bets accepted, by variant and area.", ["variant", "area"])
BET_STAKES = Counter("niuniu_table_bet_stake_minor_total", "Minor units staked, by variant.", ["variant"])
BETS_REFUSED = Counter("niuniu_table_bets_refused_total", "Bets refused, by reason.", ["reason"])


class WindowClosed(FailedPrecondition):
    """The betting window closed between the checks and the recording of a bet."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def check_limits(limits: ev.TableLimits) -> ev.TableLimits:
    merged = ev.TableLimits()
    merged.CopyFrom(DEFAULT_LIMITS)
    for field, value in limits.ListFields():
        if field.name == "chips_minor":
            del merged.chips_minor[:]
            merged.chips_minor.extend(value)
        else:
            setattr(merged, field.name, value)
    if not 0 < merged.min_bet_minor <= merged.max_bet_minor <= MAX_STAKE_MINOR:
        raise InvalidArgument("LIMITS_INVALID", "need 0 < min_bet_minor <= max_bet_minor <= 10^13")
    if not merged.chips_minor or min(merged.chips_minor) <= 0:
        raise InvalidArgument("LIMITS_INVALID", "chips_minor must list positive chip values")
    if not 1 <= merged.betting_seconds <= 600:
        raise InvalidArgument("LIMITS_INVALID", "betting_seconds must be 1..600")
    if not 0 <= merged.reveal_interval_ms <= 60_000 or not 0 <= merged.pause_between_rounds_ms <= 600_000:
        raise InvalidArgument("LIMITS_INVALID", "reveal_interval_ms must be 0..60000 and the pause 0..600000")
    return merged


def parse_config(variant: Variant, config: Mapping[str, str]) -> dict[str, str]:
    """The full configuration (defaults filled in) as text; INVALID_ARGUMENT naming a bad key."""
    try:
        return variant.config_settings(variant.parse_config(config))
    except ConfigError as error:
        raise InvalidArgument("CONFIG_INVALID", str(error)) from None


def variant_of(name: str) -> Variant:
    variant = VARIANTS.get(name)
    if variant is None:
        raise InvalidArgument("VARIANT_UNKNOWN", f"variant must be one of {', '.join(sorted(VARIANTS))}")
    return variant


class TableApp:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        store: EventStore,
        wallet: WalletPort,
        rng: RngPort,
        *,
        clock: Callable[[], datetime] = utc_now,
        notify: Callable[[str], Any] | None = None,
    ) -> None:
        self.pool = pool
        self._pool = pool
        for variant_id in VARIANTS:  # series exist from the start, so the first round shows in rate()
            for outcome in Phase.ENDED:
                ROUNDS.labels(variant_id, outcome)
        self._store = store
        self._wallet = wallet
        self._rng = rng
        self._clock = clock
        self._notify = notify
        self.jackpot = JackpotPool(wallet)
        self.banker = BankerSeats(pool, store, wallet, clock=clock, notify=notify)
        self.envelope = EnvelopeRounds(self, pool, store, wallet, rng, clock=clock)

    # ------------------------------------------------------------------ tables

    async def create_table(
        self, who: Principal, table_id: str, variant_name: str, config: Mapping[str, str], limits: ev.TableLimits
    ) -> dict[str, Any]:
        require(who, Role.ADMIN)
        if not TABLE_ID.match(table_id):
            raise InvalidArgument("TABLE_ID_MALFORMED", "table_id must be 1-64 of a-z, 0-9 and '-'")
        variant = variant_of(variant_name)
        settings = parse_config(variant, config)
        checked = check_limits(default_limits(variant, limits))
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "INSERT INTO tables (table_id, variant, config, limits, config_version) VALUES (%s, %s, %s, %s, 1)"
                " ON CONFLICT (table_id) DO NOTHING",
                (table_id, variant.variant_id, json.dumps(settings), checked.SerializeToString()),
            )
            if cur.rowcount == 0:
                existing = await self._table(conn, table_id)
                if existing["variant"] != variant.variant_id or existing["config"] != settings:
                    raise AlreadyExists("TABLE_EXISTS", f"table {table_id} exists with another variant or config")
                return existing
            created = ev.TableCreated(
                table_id=table_id,
                variant=variant.variant_id,
                config=settings,
                limits=checked,
                config_version=1,
                created_by=who.subject,
            )
            await self._append_table(conn, table_id, "table.created", created, correlation_id=table_id)
            return await self._table(conn, table_id)

    async def update_config(
        self, who: Principal, table_id: str, config: Mapping[str, str], limits: ev.TableLimits
    ) -> dict[str, Any]:
        require(who, Role.ADMIN)
        async with self._pool.connection() as conn, conn.transaction():
            table = await self._table(conn, table_id, lock=True)
            variant = variant_of(table["variant"])
            settings = parse_config(variant, config)
            checked = check_limits(default_limits(variant, limits))
            version = table["config_version"] + 1
            await conn.execute(
                "UPDATE tables SET config = %s, limits = %s, config_version = %s WHERE table_id = %s",
                (json.dumps(settings), checked.SerializeToString(), version, table_id),
            )
            changed = ev.ConfigChanged(
                table_id=table_id, config=settings, limits=checked, config_version=version, changed_by=who.subject
            )
            await self._append_table(conn, table_id, "table.config_changed", changed, correlation_id=table_id)
            return await self._table(conn, table_id)

    async def get_table(self, table_id: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        async with self._pool.connection() as conn:
            table = await self._table(conn, table_id)
            current = await self._round(conn, table["current_round_id"]) if table["current_round_id"] else None
            return table, current

    async def list_tables(self) -> list[str]:
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT table_id FROM tables ORDER BY table_id")
            return [row[0] for row in await cur.fetchall()]

    async def join(self, who: Principal, table_id: str) -> None:
        require(who, Role.PLAYER)
        async with self._pool.connection() as conn:
            await self._table(conn, table_id)
            await conn.execute(
                "INSERT INTO seats (table_id, player, joined_at) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                (table_id, who.subject, self._clock()),
            )

    async def leave(self, who: Principal, table_id: str) -> list[str]:
        """Leave the table: bets of a round still in its betting window are refunded."""
        require(who, Role.PLAYER)
        refunded: list[str] = []
        async with self._pool.connection() as conn:
            table = await self._table(conn, table_id)
            await conn.execute("DELETE FROM seats WHERE table_id = %s AND player = %s", (table_id, who.subject))
            round_id = table["current_round_id"]
            if round_id:
                cur = await conn.execute(
                    "SELECT bet_id FROM bets WHERE round_id = %s AND player = %s AND status = 'placed'",
                    (round_id, player_account(who)),
                )
                bet_ids = [row[0] for row in await cur.fetchall()]
        for bet_id in bet_ids if round_id else []:
            try:
                await self._cancel(who, table_id, bet_id, cause="left")
                refunded.append(bet_id)
            except FailedPrecondition:
                pass  # the cards are being opened: the bet settles normally
        await self.banker.leave_table(who, table_id)  # a banker leaves once their round has settled
        return refunded

    # ------------------------------------------------------------------ bets

    async def place_bet(
        self, who: Principal, command_id: str, table_id: str, area: str, amount_minor: int, round_id: str = ""
    ) -> BetReceipt:
        require(who, Role.PLAYER)
        if not COMMAND_ID.match(command_id):
            raise InvalidArgument("COMMAND_ID_MALFORMED", "command_id must be 1-128 of letters, digits and . _ : -")
        if not 0 < amount_minor <= MAX_STAKE_MINOR:
            raise InvalidArgument("AMOUNT_INVALID", "amount_minor must be positive (and at most 10^13)")
        async with self._pool.connection() as conn:
            existing = await self._bet(conn, command_id)
            if existing is not None:
                return self._replay(existing, who, table_id, area, amount_minor)
            table = await self._table(conn, table_id)
            variant = variant_of(table["variant"])
            if area not in variant.areas:
                raise InvalidArgument("AREA_UNKNOWN", f"area must be one of {', '.join(variant.areas)}")
            current = await self._round(conn, table["current_round_id"]) if table["current_round_id"] else None
            self._check_open_for_bets(current, round_id)
            assert current is not None
            limits = ev.TableLimits.FromString(current["limits"])
            config = variant.parse_config(current["config"])
            fixed = variant.fixed_stake_minor(area, config)
            if fixed is not None and amount_minor != fixed:
                BETS_REFUSED.labels("FIXED_STAKE_REQUIRED").inc()
                raise InvalidArgument("FIXED_STAKE_REQUIRED", f"a bet on {area} costs exactly {fixed}")
            await self._check_stake(conn, current, player_account(who), amount_minor, limits, fixed=fixed is not None)
            await self.banker.check_bet(
                conn, variant.variant_id, config, current["round_id"], player_account(who), amount_minor
            )
            await self.envelope.check_bet(conn, variant.variant_id, current["round_id"], player_account(who))
            hold = variant.hold_minor(amount_minor, config)
        hold_id = f"bet.{command_id}"
        expires = current["betting_closes_at"] + HOLD_GRACE
        try:
            await self._wallet.place_hold(
                hold_id, player_account(who), hold, f"bet on {area}", current["round_id"], unix_ms(expires)
            )
        except Unavailable:
            # The wallet may have placed the hold before the call timed out: release it now
            # rather than leave it to its expiry (VoidHold is idempotent and a no-op if absent).
            with contextlib.suppress(DomainError):
                await self._wallet.void_hold(hold_id)
            raise
        try:
            receipt = await self._record_bet(who, command_id, table_id, current, area, amount_minor, hold, hold_id)
        except (WindowClosed, OneBetPerRound):
            # The window closed while the wallet held, or the player's other bet of the round won
            # a race: release the hold. (A bet that lost a race with the same command id keeps
            # the hold: it belongs to the recorded bet.)
            await self._wallet.void_hold(hold_id)
            raise
        BETS.labels(variant.variant_id, area).inc()
        BET_STAKES.labels(variant.variant_id).inc(amount_minor)
        self._notify_table(table_id)
        return receipt

    def _check_open_for_bets(self, current: dict[str, Any] | None, round_id: str) -> None:
        if current is None or current["phase"] != Phase.BETTING or self._clock() >= current["betting_closes_at"]:
            BETS_REFUSED.labels("BETTING_CLOSED").inc()
            raise FailedPrecondition("BETTING_CLOSED", "no round is taking bets at this table right now")
        if round_id and round_id != current["round_id"]:
            BETS_REFUSED.labels("ROUND_MISMATCH").inc()
            raise FailedPrecondition("ROUND_MISMATCH", f"round {round_id} is not the round taking bets")

    async def _check_stake(
        self,
        conn: psycopg.AsyncConnection,
        current: dict[str, Any],
        player: str,
        amount: int,
        limits: ev.TableLimits,
        *,
        fixed: bool = False,
        replacing: str = "",
    ) -> None:
        """Table minimum and chips (not for a fixed-price side bet), and the per-player maximum (for all).

        ``replacing``: the bet this amount replaces (a changed bet), not counted as staked.
        """
        if not fixed and amount < limits.min_bet_minor:
            BETS_REFUSED.labels("BELOW_TABLE_MINIMUM").inc()
            raise FailedPrecondition("BELOW_TABLE_MINIMUM", f"the table minimum is {limits.min_bet_minor}")
        smallest_chip = min(limits.chips_minor)
        if not fixed and amount % smallest_chip:
            BETS_REFUSED.labels("NOT_A_CHIP_AMOUNT").inc()
            raise InvalidArgument("NOT_A_CHIP_AMOUNT", f"a bet is made of chips: a multiple of {smallest_chip}")
        cur = await conn.execute(
            "SELECT coalesce(sum(stake_minor), 0) FROM bets WHERE round_id = %s AND player = %s AND status = 'placed'"
            " AND bet_id <> %s",
            (current["round_id"], player, replacing),
        )
        row = await cur.fetchone()
        staked = int(row[0]) if row else 0
        if staked + amount > limits.max_bet_minor:
            BETS_REFUSED.labels("ABOVE_TABLE_MAXIMUM").inc()
            raise FailedPrecondition(
                "ABOVE_TABLE_MAXIMUM",
                f"the table maximum is {limits.max_bet_minor} per player and round; {staked} already staked",
            )

    async def _record_bet(
        self,
        who: Principal,
        command_id: str,
        table_id: str,
        current: dict[str, Any],
        area: str,
        amount: int,
        hold: int,
        hold_id: str,
    ) -> BetReceipt:
        round_id = current["round_id"]
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT phase, betting_closes_at FROM rounds WHERE round_id = %s FOR SHARE", (round_id,)
            )
            row = await cur.fetchone()
            if row is None or row[0] != Phase.BETTING or self._clock() >= row[1]:
                BETS_REFUSED.labels("BETTING_CLOSED").inc()
                raise WindowClosed("BETTING_CLOSED", "betting closed before the bet could be recorded")
            cur = await conn.execute(
                "INSERT INTO bets (bet_id, round_id, table_id, player, area, stake_minor, hold_minor, hold_id, status,"
                " placed_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'placed', %s) ON CONFLICT DO NOTHING",
                (command_id, round_id, table_id, player_account(who), area, amount, hold, hold_id, self._clock()),
            )
            if cur.rowcount == 0:  # the same command raced itself: the first one won
                existing = await self._bet(conn, command_id)
                if existing is None:  # no: a red-envelope player's other bet (one per round) won
                    raise OneBetPerRound("ALREADY_BET", "you have bet this round: change that bet with ChangeBet")
                return self._replay(existing, who, table_id, area, amount)
            await self.banker.reserve(conn, round_id, player_account(who), amount, hold_id)  # banked tables' cap
            placed = ev.BetPlaced(
                table_id=table_id,
                round_id=round_id,
                bet_id=command_id,
                player=player_account(who),
                area=area,
                stake_minor=amount,
                hold_minor=hold,
                hold_id=hold_id,
            )
            await self._store.append(
                conn,
                bet_stream(table_id, command_id),
                0,
                [NewEvent("table.bet_placed", placed, correlation_id=round_id, causation_id=command_id)],
            )
        return BetReceipt(command_id, round_id, area, amount, hold, "placed", False)

    @staticmethod
    def _replay(existing: dict[str, Any], who: Principal, table_id: str, area: str, amount: int) -> BetReceipt:
        same = (existing["player"], existing["table_id"], existing["area"], existing["stake_minor"]) == (
            player_account(who),
            table_id,
            area,
            amount,
        )
        if not same:
            raise AlreadyExists("COMMAND_ID_REUSED", "this command id was used for a different bet")
        return BetReceipt(
            existing["bet_id"],
            existing["round_id"],
            existing["area"],
            existing["stake_minor"],
            existing["hold_minor"],
            existing["status"],
            True,
        )

    async def cancel_bet(self, who: Principal, table_id: str, bet_id: str) -> BetReceipt:
        require(who, Role.PLAYER)
        return await self._cancel(who, table_id, bet_id, cause="player")

    async def _cancel(self, who: Principal, table_id: str, bet_id: str, *, cause: str) -> BetReceipt:
        async with self._pool.connection() as conn, conn.transaction():
            bet = await self._bet(conn, bet_id)
            if bet is None or bet["table_id"] != table_id or bet["player"] != player_account(who):
                raise NotFound("BET_NOT_FOUND", f"you have no bet {bet_id} at table {table_id}")
            if bet["status"] == "cancelled":
                return self._receipt(bet, replayed=True)
            cur = await conn.execute(
                "SELECT phase, betting_closes_at FROM rounds WHERE round_id = %s FOR SHARE", (bet["round_id"],)
            )
            row = await cur.fetchone()
            if row is None or row[0] != Phase.BETTING or self._clock() >= row[1]:
                raise FailedPrecondition("BETTING_CLOSED", "a bet can be cancelled only during the betting window")
            await conn.execute("UPDATE bets SET status = 'cancelled' WHERE bet_id = %s", (bet_id,))
            await self.banker.release(conn, bet["round_id"], bet["stake_minor"])
            cancelled = ev.BetCancelled(
                table_id=table_id, round_id=bet["round_id"], bet_id=bet_id, player=bet["player"], cause=cause
            )
            stream = bet_stream(table_id, bet_id)
            version = await self._store.stream_version(conn, stream)
            await self._store.append(
                conn, stream, version, [NewEvent("table.bet_cancelled", cancelled, correlation_id=bet["round_id"])]
            )
        # The settlement lists this hold again, so the wallet releases it even if this call is lost.
        await self._wallet.void_hold(bet["hold_id"])
        self._notify_table(table_id)
        return self._receipt({**bet, "status": "cancelled"}, replayed=False)

    @staticmethod
    def _receipt(bet: Mapping[str, Any], *, replayed: bool) -> BetReceipt:
        return BetReceipt(
            bet["bet_id"],
            bet["round_id"],
            bet["area"],
            bet["stake_minor"],
            bet["hold_minor"],
            bet["status"],
            replayed,
        )

    # ------------------------------------------------------------------ round lifecycle

    async def step(self, table_id: str, fencing_token: int = 0) -> float:
        """Advance the table's round by at most one step; returns seconds until the next step is due."""
        async with self._pool.connection() as conn:
            table = await self._table(conn, table_id)
            current = await self._round(conn, table["current_round_id"]) if table["current_round_id"] else None
        now = self._clock()
        if current is None or current["phase"] in Phase.ENDED:
            if current is not None and current["server_seed"] is None:  # noqa: SIM102 (two different questions)
                if not await self._reveal_seed(current) and now < current["ended_at"] + SEED_REVEAL_PATIENCE:
                    return 0.2
            await self._reveal_overdue_seeds(table_id, current)
            pause = timedelta(milliseconds=ev.TableLimits.FromString(table["limits"]).pause_between_rounds_ms)
            if await self.envelope.redeal_of(table):
                pause = timedelta(0)  # a re-deal follows its voided round at once
            if current is not None and now < current["ended_at"] + pause:
                return float((current["ended_at"] + pause - now).total_seconds())
            await self._open_round(table, fencing_token)
            return 0.0
        phase = current["phase"]
        envelope = is_envelope(table["variant"])
        if phase == Phase.BIDDING:
            closes = await self.envelope.bidding_closes_at(current["round_id"])
            if closes is not None and now < closes:
                return float((closes - now).total_seconds())
            await self.envelope.close_bidding(current)
        elif phase == Phase.BETTING:
            if now < current["betting_closes_at"]:
                return float((current["betting_closes_at"] - now).total_seconds())
            await self._close_betting(current)
        elif phase == Phase.DEALING:
            await (self.envelope.send(current) if envelope else self._deal(table, current))
        elif phase == Phase.REVEALING:
            if current["next_step_at"] is not None and now < current["next_step_at"]:
                return float((current["next_step_at"] - now).total_seconds())
            await (self.envelope.grab_next(current) if envelope else self._reveal_next(table, current))
        elif phase == Phase.SETTLING:
            await (self.envelope.settle(current) if envelope else self._settle(table, current))
        return 0.0

    async def _open_round(self, table: dict[str, Any], fencing_token: int) -> None:
        table_id = table["table_id"]
        round_no = table["round_no"] + 1
        round_id = f"{table_id}-r{round_no}"
        envelope = is_envelope(table["variant"])
        # Idempotent: a retry after a crash gets the same commitment.
        commitment = await self._rng.commit(round_id, "envelope" if envelope else "deck")
        banker = await self.banker.prepare_round(table, round_id)  # banked variants: seat and hold the banker
        redeal_of = await self.envelope.redeal_of(table)
        now = self._clock()
        limits = ev.TableLimits.FromString(table["limits"])
        closes = now + timedelta(seconds=limits.betting_seconds)
        if envelope:  # the dealer bidding window comes first
            bidding_closes, closes = self.envelope.windows(self.envelope.config(table["config"]), limits, now)
        async with self._pool.connection() as conn, conn.transaction():
            locked = await self._table(conn, table_id, lock=True)
            if locked["round_no"] != table["round_no"]:
                return  # another owner opened it first
            await conn.execute(
                "INSERT INTO rounds (round_id, table_id, round_no, phase, commitment, config, limits, config_version,"
                " betting_closes_at, fencing_token, opened_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    round_id,
                    table_id,
                    round_no,
                    Phase.BIDDING if envelope else Phase.BETTING,
                    commitment,
                    json.dumps(locked["config"]),
                    locked["limits"],
                    locked["config_version"],
                    closes,
                    fencing_token,
                    now,
                ),
            )
            await conn.execute(
                "UPDATE tables SET round_no = %s, current_round_id = %s WHERE table_id = %s",
                (round_no, round_id, table_id),
            )
            opened = ev.RoundOpened(
                table_id=table_id,
                round_id=round_id,
                round_no=round_no,
                commitment=commitment,
                betting_closes_at_unix_ms=unix_ms(closes),
                config_version=locked["config_version"],
                fencing_token=fencing_token,
            )
            self.banker.stamp_opened(opened, banker)
            if envelope:
                await self.envelope.opened(conn, table_id, round_id, bidding_closes, redeal_of, opened)
            await self._append_table(conn, table_id, "table.round_opened", opened, correlation_id=round_id)
        self._notify_table(table_id)

    async def _close_betting(self, current: dict[str, Any]) -> None:
        round_id, table_id = current["round_id"], current["table_id"]
        async with self._pool.connection() as conn, conn.transaction():
            locked = await self._round(conn, round_id, lock=True)
            if locked["phase"] != Phase.BETTING:
                return
            cur = await conn.execute(
                "SELECT count(*), coalesce(sum(stake_minor), 0) FROM bets WHERE round_id = %s AND status = 'placed'",
                (round_id,),
            )
            row = await cur.fetchone()
            assert row is not None
            await conn.execute("UPDATE rounds SET phase = %s WHERE round_id = %s", (Phase.DEALING, round_id))
            closed = ev.BettingClosed(
                table_id=table_id, round_id=round_id, bets=int(row[0]), total_stake_minor=int(row[1])
            )
            await self._append_table(conn, table_id, "table.betting_closed", closed, correlation_id=round_id)
        self._notify_table(table_id)

    async def _deal(self, table: dict[str, Any], current: dict[str, Any]) -> None:
        round_id, table_id = current["round_id"], current["table_id"]
        variant = variant_of(table["variant"])
        deck: list[str] | None = None
        for attempt in range(RNG_DRAW_ATTEMPTS):
            try:
                deck = await self._rng.draw(round_id, variant.deck_size, current["client_seed"])
                break
            except DomainError as error:
                log.warning("rng draw failed", extra={"round_id": round_id, "attempt": attempt, "error": str(error)})
                await asyncio.sleep(0.5)
        if deck is None:
            await self.void_round(table_id, round_id, "the rng service could not deal the round")
            return
        interval = timedelta(milliseconds=ev.TableLimits.FromString(current["limits"]).reveal_interval_ms)
        async with self._pool.connection() as conn, conn.transaction():
            locked = await self._round(conn, round_id, lock=True)
            if locked["phase"] != Phase.DEALING:
                return
            await conn.execute(
                "UPDATE rounds SET phase = %s, deck = %s, next_step_at = %s WHERE round_id = %s",
                (Phase.REVEALING, deck, self._clock() + interval, round_id),
            )
            dealt = ev.Dealt(
                table_id=table_id,
                round_id=round_id,
                deck_size=variant.deck_size,
                cards_dealt=variant.cards_dealt,
                client_seed=current["client_seed"],
            )
            annotate_dealt(variant, deck, dealt)
            await self._append_table(conn, table_id, "table.dealt", dealt, correlation_id=round_id)
        self._notify_table(table_id)

    def _hands(self, table: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, SeatHand]:
        variant = variant_of(table["variant"])
        return variant.deal(parse_cards(current["deck"]), variant.parse_config(current["config"]))

    async def _reveal_next(self, table: dict[str, Any], current: dict[str, Any]) -> None:
        round_id, table_id = current["round_id"], current["table_id"]
        variant = variant_of(table["variant"])
        interval = timedelta(milliseconds=ev.TableLimits.FromString(current["limits"]).reveal_interval_ms)
        hands = self._hands(table, current)
        config = variant.parse_config(current["config"])
        steps = reveal_steps(variant)
        async with self._pool.connection() as conn, conn.transaction():
            locked = await self._round(conn, round_id, lock=True)
            done = locked["reveals_done"]
            if locked["phase"] != Phase.REVEALING or done >= len(steps):
                return
            seat, group = steps[done]
            hand = variant.reveal_part(hands[seat], group, config)
            last = done + 1 == len(steps)
            # A hand revealed in parts is complete once its last part is shown.
            completes = bool(group) and group == variant.reveal_groups[-1]
            await conn.execute(
                "UPDATE rounds SET reveals_done = %s, phase = %s, next_step_at = %s WHERE round_id = %s",
                (done + 1, Phase.SETTLING if last else Phase.REVEALING, self._clock() + interval, round_id),
            )
            revealed = ev.HandRevealed(
                table_id=table_id,
                round_id=round_id,
                seat=seat,
                cards=[card.code for card in hand.cards],
                category=hand.category,
                points=hand.points,
                multiplier=_decimal(hand.multiplier),
                group=group,
                hand_category=hands[seat].category if completes else "",
            )
            await self._append_table(conn, table_id, "table.hand_revealed", revealed, correlation_id=round_id)
        self._notify_table(table_id)

    async def _settle(self, table: dict[str, Any], current: dict[str, Any]) -> None:
        round_id, table_id = current["round_id"], current["table_id"]
        variant = variant_of(table["variant"])
        config = variant.parse_config(current["config"])
        hands = self._hands(table, current)
        started = self._clock()
        async with self._pool.connection() as conn, conn.transaction():
            locked = await self._round(conn, round_id, lock=True)
            if locked["phase"] != Phase.SETTLING:
                return
            bets = await self._round_bets(conn, round_id)
            live = [
                TableBet(b["bet_id"], b["player"], b["area"], b["stake_minor"]) for b in bets if b["status"] == "placed"
            ]
            pool: PoolView | None = None
            if variant.claims_jackpot_pool(hands, live, config):
                pool = await self.jackpot.lock_and_read(conn)
            settlement = variant.settle(hands, live, config, jackpot_pool_minor=pool.payable_minor if pool else 0)
            if pool is not None:
                pool_delta = settlement.net_by_party().get(JACKPOT_POOL, 0)
                await self.jackpot.record_claim(conn, table_id, round_id, pool_delta, pool)
                log.info(
                    "jackpot pool paid",
                    extra={"round_id": round_id, "pool_delta_minor": pool_delta, "payable_minor": pool.payable_minor},
                )
            await self._save_outcomes(conn, settlement)
            odds = variant.area_odds(hands, config)
            settled = settlement_event(table_id, round_id, variant.variant_id, settlement, bets, odds)
            settled.area_outcomes.update(variant.area_outcomes(hands, config))
            settled.area_odds.update(odds)
            await self.banker.fund_settlement(conn, round_id, settled)
            await conn.execute(
                "UPDATE rounds SET phase = %s, ended_at = %s WHERE round_id = %s",
                (Phase.SETTLED, self._clock(), round_id),
            )
            await self._append_table(conn, table_id, "table.round_settled", settled, correlation_id=round_id)
        SETTLEMENT_SECONDS.labels(variant.variant_id).observe((self._clock() - started).total_seconds())
        ROUNDS.labels(variant.variant_id, "settled").inc()
        self._notify_table(table_id)

    async def _save_outcomes(self, conn: psycopg.AsyncConnection, settlement: Settlement) -> None:
        async with conn.cursor() as cur:
            await cur.executemany(
                "UPDATE bets SET status = 'settled', outcome = %s, net_minor = %s WHERE bet_id = %s",
                [(str(r.outcome), r.net_minor, r.bet_id) for r in settlement.bets],
            )

    async def void_round(self, table_id: str, round_id: str, reason: str) -> None:
        """End the round with every hold released and nothing else moved."""
        async with self._pool.connection() as conn, conn.transaction():
            table = await self._table(conn, table_id)
            locked = await self._round(conn, round_id, lock=True)
            if locked["phase"] in Phase.ENDED:
                return
            bets = await self._round_bets(conn, round_id)
            await conn.execute(
                "UPDATE bets SET status = 'refunded', outcome = 'refund', net_minor = 0"
                " WHERE round_id = %s AND status = 'placed'",
                (round_id,),
            )
            await conn.execute(
                "UPDATE rounds SET phase = %s, void_reason = %s, ended_at = %s WHERE round_id = %s",
                (Phase.VOIDED, reason, self._clock(), round_id),
            )
            voided = ev.RoundVoided(
                table_id=table_id, round_id=round_id, reason=reason, hold_ids=[b["hold_id"] for b in bets]
            )
            await self.banker.fund_void(conn, round_id, voided)
            if is_envelope(table["variant"]):
                await self.envelope.fund_void(conn, round_id, voided)
            await self._append_table(conn, table_id, "table.round_voided", voided, correlation_id=round_id)
        ROUNDS.labels(table["variant"], "voided").inc()
        self._notify_table(table_id)

    async def _reveal_overdue_seeds(self, table_id: str, current: dict[str, Any] | None) -> None:
        """Keep asking for seeds the rng had not released in time (it closes rounds from Kafka).

        A round's seed must be revealed eventually for players to verify it; the table does
        not wait for it forever, so earlier rounds are retried here, a few per step.
        """
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "SELECT * FROM rounds WHERE table_id = %s AND phase = ANY(%s) AND server_seed IS NULL"
                " AND round_id <> %s ORDER BY round_no LIMIT %s",
                (table_id, list(Phase.ENDED), current["round_id"] if current else "", OVERDUE_REVEALS_PER_STEP),
            )
            overdue = list(await cur.fetchall())
        for row in overdue:
            await self._reveal_seed(row)

    async def _reveal_seed(self, current: dict[str, Any]) -> bool:
        round_id, table_id = current["round_id"], current["table_id"]
        try:
            seed = await self._rng.reveal(round_id)
        except DomainError:
            return False  # the rng has not seen the settlement yet; try again shortly
        async with self._pool.connection() as conn, conn.transaction():
            locked = await self._round(conn, round_id, lock=True)
            if locked["server_seed"] is not None:
                return True
            await conn.execute("UPDATE rounds SET server_seed = %s WHERE round_id = %s", (seed.server_seed, round_id))
            revealed = ev.SeedRevealed(
                table_id=table_id,
                round_id=round_id,
                server_seed=seed.server_seed,
                commitment=seed.commitment,
                client_seed=seed.client_seed,
            )
            await self._append_table(conn, table_id, "table.seed_revealed", revealed, correlation_id=round_id)
        self._notify_table(table_id)
        return True

    # ------------------------------------------------------------------ reads

    async def round_bets(self, round_id: str) -> list[dict[str, Any]]:
        async with self._pool.connection() as conn:
            return await self._round_bets(conn, round_id)

    async def round_row(self, round_id: str) -> dict[str, Any]:
        async with self._pool.connection() as conn:
            return await self._round(conn, round_id)

    async def recent_rounds(self, table_id: str, limit: int) -> list[dict[str, Any]]:
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "SELECT * FROM rounds WHERE table_id = %s ORDER BY round_no DESC LIMIT %s", (table_id, limit)
            )
            return list(await cur.fetchall())

    async def _table(self, conn: psycopg.AsyncConnection, table_id: str, *, lock: bool = False) -> dict[str, Any]:
        query = "SELECT * FROM tables WHERE table_id = %s" + (" FOR UPDATE" if lock else "")
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, (table_id,))
            row = await cur.fetchone()
        if row is None:
            raise NotFound("TABLE_NOT_FOUND", f"no table {table_id}")
        return row

    async def _round(self, conn: psycopg.AsyncConnection, round_id: str, *, lock: bool = False) -> dict[str, Any]:
        query = "SELECT * FROM rounds WHERE round_id = %s" + (" FOR UPDATE" if lock else "")
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, (round_id,))
            row = await cur.fetchone()
        if row is None:
            raise NotFound("ROUND_NOT_FOUND", f"no round {round_id}")
        return row

    async def _bet(self, conn: psycopg.AsyncConnection, bet_id: str) -> dict[str, Any] | None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT * FROM bets WHERE bet_id = %s", (bet_id,))
            return await cur.fetchone()

    async def _round_bets(self, conn: psycopg.AsyncConnection, round_id: str) -> list[dict[str, Any]]:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT * FROM bets WHERE round_id = %s ORDER BY placed_at, bet_id", (round_id,))
            return list(await cur.fetchall())

    async def _append_table(
        self, conn: psycopg.AsyncConnection, table_id: str, event_type: str, payload: Message, *, correlation_id: str
    ) -> None:
        stream = table_stream(table_id)
        version = await self._store.stream_version(conn, stream)
        await self._store.append(conn, stream, version, [NewEvent(event_type, payload, correlation_id=correlation_id)])

    def _notify_table(self, table_id: str) -> None:
        if self._notify is not None:
            self._notify(table_id)


def _decimal(value: Fraction) -> str:
    return decimal_text(value)
