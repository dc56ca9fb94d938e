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

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from niuniu.table.v1 import events_pb2 as ev

from backbone.errors import FailedPrecondition, Unavailable
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
from services.table.coverage import Need, covered_settlement
from services.table.jackpot import JackpotPool, PoolReading
from services.table.ports import WalletHold
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
SETTLE_CHECK_PATIENCE = timedelta(seconds=20)
"""How long a round ready to settle waits for the wallet to answer its hold check (``settle``).

Past it the round settles as the table recorded it, unchecked (counted, logged): the wallet that
did not answer applies the settlement from Kafka later, and a settlement it then refuses goes to
the operator's repair path (docs/runbooks/NiuniuWalletSettlementRejected.md).
"""
WALLET_RETRY_S = 0.5

log = logging.getLogger(__name__)


def rng_patience_left(current: Mapping[str, Any], now: datetime) -> bool:
    """May the round still wait for the rng (else it is voided)?"""
    return bool(now < current["betting_closes_at"] + RNG_PATIENCE)


def settling_since(current: Mapping[str, Any]) -> datetime:
    """When the round became ready to settle: its last reveal's step time (the betting deadline at the latest)."""
    return current["next_step_at"] or current["betting_closes_at"]  # type: ignore[no-any-return]


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

    async def hands(self, conn: Conn, current: Row, variant: Variant[Any], config: Any) -> dict[str, SeatHand]:
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
    checks_bets = False
    """The shape refuses some bets itself (``check_bet``), before the wallet holds them."""
    reserves_stakes = False
    """The shape counts stakes in the bet's own transaction (``reserve``), so a bet is recorded alone."""
    one_bet_per_round = False
    """A player has one open bet a round (changed, not added to): part of the admission (``verify_bet``)."""

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

    async def settle(self, table: Row, current: Row) -> float | None:
        """Check the round's holds with the wallet, then settle (``_settle``); seconds to wait when the
        wallet did not answer and the round may still wait for it (``SETTLE_CHECK_PATIENCE``)."""
        try:
            holds: Mapping[str, WalletHold] | None = await self._read_holds(current)
        except Unavailable as error:
            if self.ctx.now() < settling_since(current) + SETTLE_CHECK_PATIENCE:
                return WALLET_RETRY_S
            log.warning("settling unchecked: the wallet did not answer", extra={"round_id": current["round_id"],
                                                                                "error": str(error)})  # fmt: skip
            metrics.SETTLEMENT_CHECKS.labels("unchecked").inc()
            holds = None
        # Paying from the jackpot pool needs the wallet, which is read before the transaction (jackpot.py).
        await self.jackpot.with_reading(
            self.ctx.store.pool, lambda reading: self._settle(table, current, reading, holds)
        )
        return None

    async def _read_holds(self, current: Row) -> Mapping[str, WalletHold]:
        """The wallet's view of every hold the settlement may take from (read outside any transaction:
        betting has closed, so the bets and the dealer's hold are final)."""
        async with self.ctx.store.read() as conn:
            bets = await self.ctx.store.round_bets(conn, current["round_id"])
            funding, _ = await self.funding(conn, current)
        hold_ids = [b["hold_id"] for b in bets if b["status"] == "placed"]
        return await self.ctx.wallet.read_holds(hold_ids + [funding.dealer_hold_id] * bool(funding.dealer_hold_id))

    async def _settle(
        self, table: Row, current: Row, reading: PoolReading | None, holds: Mapping[str, WalletHold] | None
    ) -> None:
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
                settled = await self._settle_in(conn, table_id, locked, variant, config, hands, reading, holds)
        if void:
            await self.redeal(table_id, round_id, void)
            return
        if isinstance(settled, str):  # the dealer's hold does not cover the round: nothing was written
            await self.void_round(table_id, round_id, f"DEALER_HOLD_UNCOVERED: {settled}")
            return
        settlement = settled
        SETTLEMENT_SECONDS.labels(variant.variant_id).observe((self.ctx.now() - started).total_seconds())
        ROUNDS.labels(variant.variant_id, Phase.SETTLED).inc()
        metrics.round_settled(table_id, variant, config, settlement, self.ctx.now())
        self.ctx.wake(table_id)

    async def _settle_in(
        self,
        conn: Conn,
        table_id: str,
        current: Row,
        variant: Variant[Any],
        config: Any,
        hands: dict[str, SeatHand],
        reading: PoolReading | None = None,
        holds: Mapping[str, WalletHold] | None = None,
    ) -> Settlement | str:
        """Settle the round in ``conn``; or, when the dealer's hold does not cover it, why (nothing written)."""
        round_id = current["round_id"]
        bets = await self.ctx.store.round_bets(conn, round_id)
        live = [table_bet(b) for b in bets if b["status"] == "placed"]
        funding, holds_besides = await self.funding(conn, current)
        refunded: list[str] = []
        if holds is not None:
            checked = self._check_coverage(round_id, bets, live, hands, variant, config, funding, holds)
            if isinstance(checked, str):
                return checked
            refunded = [b.bet_id for b in live if b not in checked]
            live = checked
        pool = None
        if variant.claims_jackpot_pool(hands, live, config):
            pool = await self.jackpot.lock_and_read(conn, reading)
            funding = replace(funding, jackpot_pool_minor=pool.payable_minor)
        settlement = variant.settle(hands, live, config, funding)
        if pool is not None:
            pool_delta = settlement.net_by_party().get(JACKPOT_POOL, 0)
            await self.jackpot.record_claim(conn, table_id, round_id, pool_delta, pool)
        await self.ctx.store.refund_bet_ids(conn, refunded)
        await self.ctx.store.save_outcomes(conn, settlement.bets)
        odds = variant.area_odds(hands, config)
        settled = settlement_event(
            table_id,
            round_id,
            variant.variant_id,
            settlement,
            [b["hold_id"] for b in bets] + holds_besides,
            {b["bet_id"]: b["hold_id"] for b in bets},
            odds,
            None if pool is None else pool.payable_minor,
        )
        settled.area_outcomes.update(variant.area_outcomes(hands, config, settlement))
        settled.area_odds.update(odds)
        await self.ctx.store.end_round(conn, round_id, Phase.SETTLED, self.ctx.now())
        await self.append(conn, table_id, "table.round_settled", settled, round_id)
        return settlement

    def _check_coverage(
        self,
        round_id: str,
        bets: Sequence[Row],
        live: list[TableBet],
        hands: dict[str, SeatHand],
        variant: Variant[Any],
        config: Any,
        funding: Funding,
        holds: Mapping[str, WalletHold],
    ) -> list[TableBet] | str:
        """The live bets the wallet's holds cover (``coverage.py``), or why the dealer's hold does not
        cover the round. Counts and logs what it leaves out."""
        recorded = {b["hold_id"]: Need(b["player"], int(b["hold_minor"])) for b in bets if b["status"] == "placed"}
        verdict = covered_settlement(
            lambda some: variant.settle(hands, some, config, funding), live, recorded, funding, holds, round_id
        )
        for bet_id, reason in verdict.refunded.items():
            metrics.BETS_REFUNDED_UNCOVERED.labels(reason).inc()
            log.error("bet refunded at settlement: the wallet's hold does not cover it",
                      extra={"round_id": round_id, "bet_id": bet_id, "reason": reason})  # fmt: skip
        if verdict.void_reason:
            metrics.SETTLEMENT_CHECKS.labels("voided").inc()
            log.error("round voided at settlement: the dealer's hold does not cover it",
                      extra={"round_id": round_id, "reason": verdict.void_reason})  # fmt: skip
            return verdict.void_reason
        metrics.SETTLEMENT_CHECKS.labels("refunded" if verdict.refunded else "covered").inc()
        return list(verdict.live)

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

    async def void_rejected(self, table_id: str, round_id: str, reason: str) -> ev.RoundVoided | None:
        """Void a settled round whose settlement the wallet refused: the operator's repair (``repair.py``).

        The RoundVoided lists every hold of the round, so the wallet, which accepts a void of a round
        whose settlement it rejected, releases them all; the round's bets become refunds. None when
        the round is voided already. Raises ConcurrencyError when the table's stream moved meanwhile
        (the caller tries again), FailedPrecondition ROUND_NOT_SETTLED for a round in any other phase.
        """
        async with self.ctx.store.transaction() as conn:
            locked = await self.ctx.store.round(conn, round_id, lock=True)
            if locked["table_id"] != table_id:
                raise FailedPrecondition("ROUND_NOT_AT_TABLE", f"round {round_id} is not table {table_id}'s")
            if locked["phase"] == Phase.VOIDED:
                return None
            if locked["phase"] != Phase.SETTLED:
                raise FailedPrecondition("ROUND_NOT_SETTLED", f"round {round_id} is {locked['phase']}, not settled")
            bets = await self.ctx.store.round_bets(conn, round_id)
            _, holds = await self.funding(conn, locked)
            await self.ctx.store.refund_settled_round(conn, round_id)
            await self.ctx.store.end_round(conn, round_id, Phase.VOIDED, self.ctx.now(), reason)
            voided = ev.RoundVoided(
                table_id=table_id, round_id=round_id, reason=reason, hold_ids=[b["hold_id"] for b in bets] + holds
            )
            await self.append(conn, table_id, "table.round_voided", voided, round_id)
        self.ctx.wake(table_id)
        return voided

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
