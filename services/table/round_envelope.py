"""The bidding-dealer round of 68 NiuNiu, red-envelope bull (``red_envelope_bull``).

    bidding --close_bidding--> betting --close_betting--> dealing --send--> revealing --grab_next x N-->
    settling --settle--> settled
    bidding: no bid -> voided (NO_DEALER); dealing: no bet -> voided (NO_BETS);
    dealing: the rng fails or its split is not one share each -> voided and re-dealt (ENVELOPE_ERROR);
    settling: the dealer grabbed 0.01 -> voided and re-dealt (the variant's void reason)

1. **Bidding** (``bidding.seconds``, 18 s): players bid for the dealer seat
   (``bidding.py``); each bid is held with the dealer's three fees.
2. At the deadline the highest bid wins (``DealerChosen``): the bid is the dealer
   pool and its hold is the dealer's for the round.
3. **Betting** (the table's ``betting_seconds``, 40 s unless set): one bet per
   player against the dealer, held at stake x 18, changeable (``ChangeBet``).
4. **The envelope**: the rng splits ``envelope.total_minor`` into one share per
   participant (position 0 the dealer, then the bettors in bet order) and draws the
   grab order; the variant deals it and the grabs are stored, then revealed one
   per ``reveal_interval_ms`` (``EnvelopeGrabbed``). No amount leaves the server
   before its grab.
5. **Settlement** by the variant (``bull.variants.red_envelope_bull``): the dealer
   pays from the pool's hold and past it from what the round's losers paid them.
   Every void releases every hold of the round, bids included; a re-deal opens the
   next round at once with ``RoundOpened.redeal_of``.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from niuniu.table.v1 import events_pb2 as ev

from backbone.errors import DomainError, FailedPrecondition, Unavailable
from bull.rules import red_envelope as re_
from bull.variants import EnvelopeSplit, Funding, SeatHand, Variant
from bull.variants.red_envelope_bull import DEALER_SEAT, MIN_SHARE_MINOR, EnvelopeTableConfig
from services.table.common import REDEALS, Phase, round_client_seed, unix_ms, variant_of
from services.table.envelope_store import Grab
from services.table.round_base import (
    RNG_RETRY_S,
    Opening,
    RoundMachine,
    Step,
    limits_of,
    reveal_interval,
    rng_patience_left,
)
from services.table.store import Conn, Row

log = logging.getLogger(__name__)


def envelope_config(settings: Any) -> EnvelopeTableConfig:
    return EnvelopeTableConfig.from_settings(settings)


def grab_event(table_id: str, round_id: str, grab: Grab, config: EnvelopeTableConfig) -> ev.EnvelopeGrabbed:
    hand = re_.evaluate(grab.amount_minor)
    return ev.EnvelopeGrabbed(
        table_id=table_id,
        round_id=round_id,
        grab_no=grab.grab_no,
        position=grab.position,
        participant=grab.participant,
        amount_minor=grab.amount_minor,
        amount_text=hand.text,
        category=hand.category,
        points=hand.points,
        multiplier=config.rules.multiplier(hand.category),
        bet_id=grab.bet_id,
        dealer=grab.position == 0,
    )


def split_of(grabs: list[Grab]) -> EnvelopeSplit:
    """The stored grabs as the variant's deal input."""
    seats = {g.position: g.bet_id or DEALER_SEAT for g in grabs}
    return EnvelopeSplit(
        tuple(seats[p] for p in range(len(grabs))),
        tuple(g.amount_minor for g in grabs),
        tuple(g.position for g in grabs),
    )


class BiddingDealerRound(RoundMachine):
    changes_bets = True
    checks_bets = True
    one_bet_per_round = True

    def steps(self) -> dict[str, Step]:
        return super().steps() | {
            Phase.BIDDING: self.close_bidding,
            Phase.DEALING: self.send,
            Phase.REVEALING: self.grab_next,
        }

    async def due(self, current: Row) -> datetime | None:
        if current["phase"] == Phase.BIDDING:
            return await self.ctx.envelopes.bidding_closes_at(current["round_id"])
        return self.deadline(current)

    # ------------------------------------------------------------------ opening

    async def redeal_of(self, table: Row) -> str:
        last = table["current_round_id"]
        return str(last) if last and await self.ctx.envelopes.is_redeal(last) else ""

    async def prepare(self, table: Row, round_id: str) -> Opening:
        config = envelope_config(table["config"])
        redeal_of = await self.redeal_of(table)
        bidding_closes = self.ctx.now() + timedelta(seconds=config.bidding_seconds)
        # The betting deadline as estimated at the opening; fixed when the dealer is chosen.
        closes = bidding_closes + timedelta(seconds=limits_of(table).betting_seconds)

        def stamp(opened: ev.RoundOpened) -> None:
            opened.bidding_closes_at_unix_ms = unix_ms(bidding_closes)
            opened.redeal_of = redeal_of

        async def record(conn: Conn) -> None:
            await self.ctx.envelopes.open(conn, round_id, table["table_id"], bidding_closes, redeal_of)

        return Opening(Phase.BIDDING, closes, stamp, record)

    async def close_bidding(self, table: Row, current: Row) -> None:
        """The bidding deadline passed: the highest bid deals (or, with no bid, the round is voided)."""
        round_id, table_id = current["round_id"], current["table_id"]
        envelopes = self.ctx.envelopes
        async with self.ctx.store.transaction() as conn:
            locked = await self.ctx.store.round(conn, round_id, lock=True)
            if locked["phase"] != Phase.BIDDING:
                return
            row = await envelopes.row(conn, round_id, lock=True)
            if self.ctx.now() < row["bidding_closes_at"]:
                return
            leader = await envelopes.bid(conn, row["leading_bid_id"]) if row["leading_bid_id"] else None
            if leader is not None:
                closes = self.ctx.now() + timedelta(seconds=limits_of(current).betting_seconds)
                bids = await envelopes.bid_count(conn, round_id)
                await envelopes.seat_dealer(conn, round_id, leader)
                await self.ctx.store.open_betting(conn, round_id, closes)
                chosen = ev.DealerChosen(
                    table_id=table_id,
                    round_id=round_id,
                    dealer=leader["player"],
                    bid_id=leader["bid_id"],
                    dealer_pool_minor=leader["amount_minor"],
                    hold_id=leader["hold_id"],
                    hold_minor=leader["hold_minor"],
                    betting_closes_at_unix_ms=unix_ms(closes),
                    bids=bids,
                )
                await self.append(conn, table_id, "table.dealer_chosen", chosen, round_id)
        if leader is None:
            await self.void_round(table_id, round_id, "NO_DEALER: nobody bid for the dealer seat")
            return
        self.ctx.wake(table_id)

    # ------------------------------------------------------------------ bets

    async def check_bet(self, conn: Conn, config: Any, round_id: str, player: str, amount: int) -> None:
        """Not the dealer (a second bet is the admission's: ``one_bet_per_round``)."""
        row = await self.ctx.envelopes.row(conn, round_id)
        if row["dealer"] == player:
            raise FailedPrecondition("DEALER_CANNOT_BET", "the dealer plays against the bettors, not with them")

    # ------------------------------------------------------------------ the envelope

    async def send(self, table: Row, current: Row) -> float | None:
        """Betting closed: split the envelope among the dealer and the bettors, or void the round."""
        round_id, table_id = current["round_id"], current["table_id"]
        variant = variant_of(table["variant"])
        config = envelope_config(current["config"])
        async with self.ctx.store.read() as conn:
            row = await self.ctx.envelopes.row(conn, round_id)
            bets = [b for b in await self.ctx.store.round_bets(conn, round_id) if b["status"] == "placed"]
        if not bets:
            await self.void_round(table_id, round_id, "NO_BETS: nobody bet against the dealer")
            return None
        participants = [row["dealer"], *(b["player"] for b in bets)]
        seats = (DEALER_SEAT, *(b["bet_id"] for b in bets))
        client_seed, contributions = round_client_seed(bets)
        try:  # one try per step: the next step tries again, so the envelope goes as soon as the rng answers
            hands = await self._split(variant, config, round_id, client_seed, seats, contributions)
        except Unavailable as error:
            log.warning("rng split failed", extra={"round_id": round_id, "error": str(error)})
            if rng_patience_left(current, self.ctx.now()):
                return RNG_RETRY_S
            hands = None
        if hands is None:
            await self.redeal(table_id, round_id, "ENVELOPE_ERROR: the red envelope could not be sent")
            return None
        grabs = [
            Grab(k, seats.index(seat), participants[seats.index(seat)], "" if seat == DEALER_SEAT else seat,
                 hands[seat].amount_minor)
            for k, (seat, _) in enumerate(variant.reveal_plan(hands))
        ]  # fmt: skip
        async with self.ctx.store.transaction() as conn:
            locked = await self.ctx.store.round(conn, round_id, lock=True)
            if locked["phase"] != Phase.DEALING:
                return None
            await self.ctx.envelopes.insert_grabs(conn, round_id, grabs)
            await self.ctx.store.set_client_seed(conn, round_id, client_seed)
            await self.ctx.store.dealt(conn, round_id, Phase.REVEALING, None, self.ctx.now() + reveal_interval(current))
            sent = ev.EnvelopeSent(
                table_id=table_id,
                round_id=round_id,
                total_minor=config.rules.envelope_total_minor,
                shares=len(participants),
                min_minor=MIN_SHARE_MINOR,
                client_seed=client_seed,
                participants=participants,
            )
            await self.append(conn, table_id, "table.envelope_sent", sent, round_id)
        self.ctx.wake(table_id)
        return None

    async def _split(
        self,
        variant: Variant[Any],
        config: EnvelopeTableConfig,
        round_id: str,
        client_seed: str,
        seats: tuple[str, ...],
        contributions: list[str],
    ) -> dict[str, SeatHand] | None:
        """The envelope dealt by the variant; None for an envelope error (the rng refusing, or a bad split).

        ``client_seed`` combines the players' ``contributions`` (docs/fairness.md, section 10).
        Raises ``Unavailable`` when the rng did not answer (the step tries again).
        """
        total = config.rules.envelope_total_minor
        try:
            amounts, order = await self.ctx.rng.split_envelope(
                round_id, total, len(seats), MIN_SHARE_MINOR, client_seed, client_seeds=contributions
            )
            return variant.deal(EnvelopeSplit(seats, tuple(amounts), tuple(order)), config)
        except ValueError as error:
            log.error("envelope error", extra={"round_id": round_id, "error": str(error)})
            return None
        except Unavailable:
            raise
        except DomainError as error:
            log.warning("rng refused the split", extra={"round_id": round_id, "error": str(error)})
            return None

    async def grab_next(self, table: Row, current: Row) -> None:
        """Reveal the next grab; after the last one the round settles."""
        round_id, table_id = current["round_id"], current["table_id"]
        config = envelope_config(current["config"])
        async with self.ctx.store.transaction() as conn:
            locked = await self.ctx.store.round(conn, round_id, lock=True)
            if locked["phase"] != Phase.REVEALING:
                return
            grabs = await self.ctx.envelopes.grabs(conn, round_id)
            done = locked["reveals_done"]
            if done >= len(grabs):
                return
            last = done + 1 == len(grabs)
            next_at = self.ctx.now() + reveal_interval(current)
            await self.ctx.store.revealed(
                conn, round_id, done + 1, Phase.SETTLING if last else Phase.REVEALING, next_at
            )
            grabbed = grab_event(table_id, round_id, grabs[done], config)
            await self.append(conn, table_id, "table.envelope_grabbed", grabbed, round_id)
        self.ctx.wake(table_id)

    # ------------------------------------------------------------------ settlement

    async def hands(self, conn: Conn, current: Row, variant: Variant[Any], config: Any) -> dict[str, SeatHand]:
        return variant.deal(split_of(await self.ctx.envelopes.grabs(conn, current["round_id"])), config)

    async def funding(self, conn: Conn, current: Row) -> tuple[Funding, list[str]]:
        round_id = current["round_id"]
        row = await self.ctx.envelopes.row(conn, round_id)
        holds = await self.ctx.envelopes.bid_holds(conn, round_id)  # every bid's hold, the dealer's included
        if row["dealer"] is None:
            return Funding(), holds
        funding = Funding(
            dealer=row["dealer"],
            dealer_hold_id=row["dealer_hold_id"],
            dealer_hold_minor=int(row["dealer_hold_minor"]),
            dealer_pool_minor=int(row["dealer_pool_minor"]),
        )
        return funding, holds

    async def redeal(self, table_id: str, round_id: str, reason: str) -> None:
        REDEALS.labels(reason.partition(":")[0]).inc()
        await self.ctx.envelopes.mark_redeal(round_id)
        await self.void_round(table_id, round_id, reason)
