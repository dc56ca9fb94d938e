"""The round as a state machine: what every round shape shares.

A round moves through phases (``Phase``); each shape (``round_cards.py``: the
house dealer and the banker seat; ``round_envelope.py``: the bidding dealer)
maps its phases to steps. ``step`` runs at most one step: it re-reads the round
under its row lock, checks the phase it expects, writes the new phase with the
events that announce it in one transaction, so a restarted or competing owner can
never apply a step twice, and every deadline is stored, so a restart resumes
where the round was. The Variant (``bull.variants``) decides everything about
the game: the deal, the reveal plan, whether the hands void the round, the
settlement and who funds it; a machine decides only when and what is stored.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from niuniu.table.v1 import events_pb2 as ev

from backbone.errors import FailedPrecondition
from backbone.lease import check_fence
from bull.money import JACKPOT_POOL, Settlement
from bull.variants import Funding, SeatHand, TableBet, Variant
from services.table import metrics
from services.table.common import (
    ROUNDS,
    SETTLEMENT_SECONDS,
    Phase,
    settlement_event,
    table_stream,
    unix_ms,
    variant_of,
)
from services.table.context import TableContext
from services.table.jackpot import JackpotPool, PoolReading
from services.table.store import Conn, Row

Step = Callable[[Row, Row], Awaitable[float | None]]
"""A step of the round: None when it ran, or seconds to wait before trying it again (a call failed)."""

RNG_PATIENCE = timedelta(seconds=20)
"""How long after betting closed a round waits for the rng to deal (or split) before it is voided.

The rng is tried once per step (each call has its deadline, ``ports.CALL_TIMEOUT_S``), never in a
loop inside a step, so a step stays well within the table's lease, and the round deals as soon
as the rng answers again.
"""
RNG_RETRY_S = 0.5


def rng_patience_left(current: Mapping[str, Any], now: datetime) -> bool:
    """May the round still wait for the rng (else it is voided)?"""
    return bool(now < current["betting_closes_at"] + RNG_PATIENCE)


@dataclass
class Opening:
    """What a shape fixes before its round opens: the first phase, deadlines, and its part of RoundOpened."""

    phase: str
    betting_closes_at: datetime
    stamp: Callable[[ev.RoundOpened], None] = lambda opened: None
    record: Callable[[Conn], Awaitable[None]] | None = None


def limits_of(row: Mapping[str, Any]) -> ev.TableLimits:
    return ev.TableLimits.FromString(row["limits"])


def check_not_closing(table: Mapping[str, Any]) -> None:
    """Refuse a bet or bid at a table an admin closed (CloseTable): its last round takes no new stakes."""
    if table.get("closing_at") is not None:
        raise FailedPrecondition("TABLE_CLOSED", f"table {table['table_id']} is closed")


def reveal_interval(row: Mapping[str, Any]) -> timedelta:
    return timedelta(milliseconds=limits_of(row).reveal_interval_ms)


class RoundMachine:
    """The phases every shape shares: opening, closing the betting window, settling, voiding."""

    def __init__(self, ctx: TableContext) -> None:
        self.ctx = ctx
        self.jackpot = JackpotPool(ctx.wallet)

    # ------------------------------------------------------------------ the machine

    def steps(self) -> dict[str, Step]:
        """Phase -> the step that leaves it; a shape adds its own phases."""
        return {Phase.BETTING: self.close_betting, Phase.SETTLING: self.settle}

    def deadline(self, current: Row) -> datetime | None:
        """When the round's current phase may be left (None: at once)."""
        if current["phase"] == Phase.BETTING:
            return current["betting_closes_at"]  # type: ignore[no-any-return]
        if current["phase"] == Phase.REVEALING:
            return current["next_step_at"]  # type: ignore[no-any-return]
        return None

    async def due(self, current: Row) -> datetime | None:
        return self.deadline(current)

    async def step(self, table: Row, current: Row) -> float:
        """Run the step the round's phase is waiting for, if it is due; seconds until the next one."""
        due = await self.due(current)
        now = self.ctx.now()
        if due is not None and now < due:
            return float((due - now).total_seconds())
        step = self.steps().get(current["phase"])
        if step is None:
            raise FailedPrecondition("ROUND_PHASE_UNKNOWN", f"round {current['round_id']} is {current['phase']}")
        retry = await step(table, current)
        return retry or 0.0

    # ------------------------------------------------------------------ hooks of the shapes

    async def prepare(self, table: Row, round_id: str) -> Opening:
        closes = self.ctx.now() + timedelta(seconds=limits_of(table).betting_seconds)
        return Opening(Phase.BETTING, closes)

    async def redeal_of(self, table: Row) -> str:
        """The round a new round re-deals ("" when it is not a re-deal)."""
        return ""

    async def hands(self, conn: Conn, current: Row, variant: Variant, config: Any) -> dict[str, SeatHand]:
        raise NotImplementedError

    async def funding(self, conn: Conn, current: Row) -> tuple[Funding, list[str]]:
        """Who deals or banks the round, from which hold; and the holds it releases besides its bets'."""
        return Funding(), []

    async def check_bet(self, conn: Conn, config: Any, round_id: str, player: str, amount: int) -> None:
        """Refuse a bet the shape does not take (before the wallet holds it)."""

    async def reserve(self, conn: Conn, round_id: str, player: str, amount: int, hold_id: str) -> None:
        """In the bet's transaction: count it where the shape caps the stakes."""

    async def release(self, conn: Conn, round_id: str, amount: int) -> None:
        """A cancelled bet's stake no longer counts."""

    changes_bets = False

    # ------------------------------------------------------------------ shared steps

    async def open(self, table: Row, fencing_token: int) -> None:
        table_id = table["table_id"]
        round_no = table["round_no"] + 1
        round_id = f"{table_id}-r{round_no}"
        variant = variant_of(table["variant"])
        commitment = await self.ctx.rng.commit(round_id, variant.commit_purpose)  # a retry gets the same one
        opening = await self.prepare(table, round_id)
        async with self.ctx.store.transaction() as conn:
            locked = await self.ctx.store.table(conn, table_id, lock=True)
            if locked["round_no"] != table["round_no"]:
                return  # another owner opened it first
            now = self.ctx.now()
            await self.ctx.store.insert_round(
                conn, locked, round_id, round_no, opening.phase, commitment, opening.betting_closes_at,
                fencing_token, now,
            )  # fmt: skip
            opened = ev.RoundOpened(
                table_id=table_id,
                round_id=round_id,
                round_no=round_no,
                commitment=commitment,
                betting_closes_at_unix_ms=unix_ms(opening.betting_closes_at),
                config_version=locked["config_version"],
                fencing_token=fencing_token,
            )
            opening.stamp(opened)
            if opening.record is not None:
                await opening.record(conn)
            await self.append(conn, table_id, "table.round_opened", opened, round_id)
        metrics.round_opened(locked, variant)
        self.ctx.wake(table_id)

    async def close_betting(self, table: Row, current: Row) -> None:
        round_id, table_id = current["round_id"], current["table_id"]
        async with self.ctx.store.transaction() as conn:
            locked = await self.ctx.store.round(conn, round_id, lock=True)
            if locked["phase"] != Phase.BETTING:
                return
            bets, total = await self.ctx.store.betting_totals(conn, round_id)
            await self.ctx.store.set_phase(conn, round_id, Phase.DEALING)
            closed = ev.BettingClosed(table_id=table_id, round_id=round_id, bets=bets, total_stake_minor=total)
            await self.append(conn, table_id, "table.betting_closed", closed, round_id)
        self.ctx.wake(table_id)

    async def settle(self, table: Row, current: Row) -> None:
        # Paying from the jackpot pool needs the wallet, which is read before the transaction (jackpot.py).
        await self.jackpot.with_reading(self.ctx.store.pool, lambda reading: self._settle(table, current, reading))

    async def _settle(self, table: Row, current: Row, reading: PoolReading | None) -> None:
        round_id, table_id = current["round_id"], current["table_id"]
        variant = variant_of(table["variant"])
        config = variant.parse_config(current["config"])
        started = self.ctx.now()
        async with self.ctx.store.transaction() as conn:
            locked = await self.ctx.store.round(conn, round_id, lock=True)
            if locked["phase"] != Phase.SETTLING:
                return
            hands = await self.hands(conn, locked, variant, config)
            void = variant.void_reason(hands, config)
            if not void:
                settlement = await self._settle_in(conn, table_id, locked, variant, config, hands, reading)
        if void:
            await self.redeal(table_id, round_id, void)
            return
        SETTLEMENT_SECONDS.labels(variant.variant_id).observe((self.ctx.now() - started).total_seconds())
        ROUNDS.labels(variant.variant_id, Phase.SETTLED).inc()
        metrics.round_settled(table_id, variant, config, settlement, self.ctx.now())
        self.ctx.wake(table_id)

    async def _settle_in(
        self,
        conn: Conn,
        table_id: str,
        current: Row,
        variant: Variant,
        config: Any,
        hands: dict[str, SeatHand],
        reading: PoolReading | None = None,
    ) -> Settlement:
        round_id = current["round_id"]
        bets = await self.ctx.store.round_bets(conn, round_id)
        live = [table_bet(b) for b in bets if b["status"] == "placed"]
        funding, holds = await self.funding(conn, current)
        pool = None
        if variant.claims_jackpot_pool(hands, live, config):
            pool = await self.jackpot.lock_and_read(conn, reading)
            funding = replace(funding, jackpot_pool_minor=pool.payable_minor)
        settlement = variant.settle(hands, live, config, funding)
        if pool is not None:
            pool_delta = settlement.net_by_party().get(JACKPOT_POOL, 0)
            await self.jackpot.record_claim(conn, table_id, round_id, pool_delta, pool)
        await self.ctx.store.save_outcomes(conn, settlement.bets)
        odds = variant.area_odds(hands, config)
        settled = settlement_event(
            table_id,
            round_id,
            variant.variant_id,
            settlement,
            [b["hold_id"] for b in bets] + holds,
            {b["bet_id"]: b["hold_id"] for b in bets},
            odds,
            None if pool is None else pool.payable_minor,
        )
        settled.area_outcomes.update(variant.area_outcomes(hands, config, settlement))
        settled.area_odds.update(odds)
        await self.ctx.store.end_round(conn, round_id, Phase.SETTLED, self.ctx.now())
        await self.append(conn, table_id, "table.round_settled", settled, round_id)
        return settlement

    async def redeal(self, table_id: str, round_id: str, reason: str) -> None:
        """Void a round the hands cannot settle (a shape that re-deals opens the next one at once)."""
        await self.void_round(table_id, round_id, reason)

    async def void_round(self, table_id: str, round_id: str, reason: str) -> None:
        """End the round with every hold released and nothing else moved."""
        async with self.ctx.store.transaction() as conn:
            table = await self.ctx.store.table(conn, table_id)
            locked = await self.ctx.store.round(conn, round_id, lock=True)
            if locked["phase"] in Phase.ENDED:
                return
            bets = await self.ctx.store.round_bets(conn, round_id)
            _, holds = await self.funding(conn, locked)
            await self.ctx.store.refund_bets(conn, round_id)
            await self.ctx.store.end_round(conn, round_id, Phase.VOIDED, self.ctx.now(), reason)
            voided = ev.RoundVoided(
                table_id=table_id, round_id=round_id, reason=reason, hold_ids=[b["hold_id"] for b in bets] + holds
            )
            await self.append(conn, table_id, "table.round_voided", voided, round_id)
        ROUNDS.labels(table["variant"], Phase.VOIDED).inc()
        metrics.round_ended(table_id, self.ctx.now())
        self.ctx.wake(table_id)

    async def append(self, conn: Conn, table_id: str, event_type: str, payload: Any, round_id: str) -> None:
        """An event on the table's stream; the round (or table) row lock orders the appends.

        Every step of the round writes through here, so this is where the owner's fencing
        token is checked (``backbone.lease.check_fence``): a superseded owner's step is refused
        and rolled back.
        """
        await check_fence(conn)
        await self.ctx.store.append(conn, table_stream(table_id), event_type, payload, correlation_id=round_id)


def table_bet(row: Mapping[str, Any]) -> TableBet:
    return TableBet(row["bet_id"], row["player"], row["area"], int(row["stake_minor"]), row["hold_id"])
