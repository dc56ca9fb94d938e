"""The card rounds: the house dealer (golden_bull, bai_buu) and the banker seat (baibian_bull).

    betting --close_betting--> dealing --deal--> revealing --reveal_next x N--> settling --settle--> settled
       any phase --void_round--> voided (the rng cannot deal)

The deck is drawn from the rng when betting has closed and stored with the round;
each reveal is one step of the variant's reveal plan (``HandRevealed``), so no
card leaves the server before its reveal. A banker-seat round additionally seats
and holds its banker before it opens, refuses bets past the banker's cap, and is
settled against the banker (``BankerSeats.funding``).
"""

from __future__ import annotations

import logging
from typing import Any

from niuniu.table.v1 import events_pb2 as ev

from backbone.errors import DomainError
from bull.cards import parse_cards
from bull.variants import Funding, SeatHand, Variant
from bull.variants import baibian_bull as bbv
from bull.variants.base import decimal_text
from services.table.banker import BankerSeats, stamp_opened
from services.table.common import Phase, round_client_seed, variant_of
from services.table.context import TableContext
from services.table.round_base import (
    RNG_RETRY_S,
    Opening,
    RoundMachine,
    Step,
    reveal_interval,
    rng_patience_left,
)
from services.table.store import Conn, Row

log = logging.getLogger(__name__)


class HouseDealerRound(RoundMachine):
    def steps(self) -> dict[str, Step]:
        return super().steps() | {Phase.DEALING: self.deal, Phase.REVEALING: self.reveal_next}

    async def hands(self, conn: Conn, current: Row, variant: Variant[Any], config: Any) -> dict[str, SeatHand]:
        return variant.deal(parse_cards(current["deck"]), config)

    async def deal(self, table: Row, current: Row) -> float | None:
        round_id, table_id = current["round_id"], current["table_id"]
        variant = variant_of(table["variant"])
        async with self.ctx.store.read() as conn:  # betting has closed: the bets are final
            client_seed, contributions = round_client_seed(await self.ctx.store.round_bets(conn, round_id))
        try:  # one try per step: the next step tries again, so the round deals as soon as the rng answers
            deck = await self.ctx.rng.draw(round_id, variant.deck_size, client_seed, client_seeds=contributions)
        except DomainError as error:
            log.warning("rng draw failed", extra={"round_id": round_id, "error": str(error)})
            if rng_patience_left(current, self.ctx.now()):
                return RNG_RETRY_S
            await self.void_round(table_id, round_id, "the rng service could not deal the round")
            return None
        async with self.ctx.store.transaction() as conn:
            locked = await self.ctx.store.round(conn, round_id, lock=True)
            if locked["phase"] != Phase.DEALING:
                return None
            next_at = self.ctx.now() + reveal_interval(current)
            await self.ctx.store.set_client_seed(conn, round_id, client_seed)
            await self.ctx.store.dealt(conn, round_id, Phase.REVEALING, deck, next_at)
            dealt = ev.Dealt(
                table_id=table_id,
                round_id=round_id,
                deck_size=variant.deck_size,
                cards_dealt=variant.cards_dealt,
                client_seed=client_seed,
            )
            if variant.variant_id == bbv.BAIBIAN_BULL.variant_id:  # the drawn card is shown and burned
                config = bbv.BAIBIAN_BULL.parse_config(current["config"])  # the same variant, its config typed
                dealt.drawn_card, dealt.first_seat = bbv.deal_facts(parse_cards(deck), config)
            await self.append(conn, table_id, "table.dealt", dealt, round_id)
        self.ctx.wake(table_id)
        return None

    async def reveal_next(self, table: Row, current: Row) -> None:
        round_id, table_id = current["round_id"], current["table_id"]
        variant = variant_of(table["variant"])
        config = variant.parse_config(current["config"])
        async with self.ctx.store.transaction() as conn:
            locked = await self.ctx.store.round(conn, round_id, lock=True)
            hands = await self.hands(conn, locked, variant, config)
            plan = variant.reveal_plan(hands)
            done = locked["reveals_done"]
            if locked["phase"] != Phase.REVEALING or done >= len(plan):
                return
            seat, group = plan[done]
            hand = variant.reveal_part(hands[seat], group, config)
            last = done + 1 == len(plan)
            # A hand revealed in parts is complete once its last part is shown.
            completes = bool(group) and group == variant.reveal_groups[-1]
            next_at = self.ctx.now() + reveal_interval(current)
            await self.ctx.store.revealed(
                conn, round_id, done + 1, Phase.SETTLING if last else Phase.REVEALING, next_at
            )
            revealed = ev.HandRevealed(
                table_id=table_id,
                round_id=round_id,
                seat=seat,
                cards=[card.code for card in hand.cards],
                category=hand.category,
                points=hand.points,
                multiplier=decimal_text(hand.multiplier),
                group=group,
                hand_category=hands[seat].category if completes else "",
            )
            await self.append(conn, table_id, "table.hand_revealed", revealed, round_id)
        self.ctx.wake(table_id)


class BankerSeatRound(HouseDealerRound):
    """A player banks: seated and held before the round opens, settled against, capped (``banker.py``)."""

    checks_bets = True
    reserves_stakes = True

    def __init__(self, ctx: TableContext, seats: BankerSeats) -> None:
        super().__init__(ctx)
        self.seats = seats

    async def prepare(self, table: Row, round_id: str) -> Opening:
        plan = await self.seats.prepare_round(table, round_id)
        opening = await super().prepare(table, round_id)
        opening.stamp = lambda opened: stamp_opened(opened, plan)
        return opening

    async def funding(self, conn: Conn, current: Row) -> tuple[Funding, list[str]]:
        return await self.seats.funding(conn, current["round_id"])

    async def check_bet(self, conn: Conn, config: Any, round_id: str, player: str, amount: int) -> None:
        await self.seats.check_bet(conn, config, round_id, player, amount)

    async def reserve(self, conn: Conn, round_id: str, player: str, amount: int, hold_id: str) -> None:
        await self.seats.reserve(conn, round_id, player, amount, hold_id)

    async def release(self, conn: Conn, round_id: str, amount: int) -> None:
        await self.seats.release(conn, round_id, amount)
