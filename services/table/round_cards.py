"""The card rounds: the house dealer (golden_bull, bai_buu) and the banker seat (baibian_bull).

    betting --close_betting--> dealing --deal--> revealing --reveal_next x N--> settling --settle--> settled
       any phase --void_round--> voided (the rng cannot deal)

Each arrow is a step that asks ``decide`` (``round_base.RoundMachine.decided``).

The deck is drawn from the rng when betting has closed and stored with the round;
each reveal is one step of the variant's reveal plan (``HandRevealed``), so no
card leaves the server before its reveal. A banker-seat round additionally seats
and holds its banker before it opens, refuses bets past the banker's cap, and is
settled against the banker (``core.settlement.funding_of``).
"""

from __future__ import annotations

import logging
from typing import Any

from backbone.errors import DomainError
from services.table.banker import BankerSeats, stamp_opened
from services.table.common import Phase, variant_of
from services.table.context import TableContext
from services.table.core.commands import Command, Deal, RngFailed, Tick
from services.table.core.decide import client_seed_of
from services.table.round_base import RNG_RETRY_S, Opening, RoundMachine, Step
from services.table.store import Conn, Row

log = logging.getLogger(__name__)


class HouseDealerRound(RoundMachine):
    def steps(self) -> dict[str, Step]:
        return super().steps() | {Phase.DEALING: self.deal, Phase.REVEALING: self.reveal_next}

    async def deal(self, table: Row, current: Row) -> float | None:
        """Draw the deck from the rng (one try a step) and deal it as ``decide`` says (``Deal``); when the rng
        does not answer, ``RngFailed``: the round waits for it, then is voided."""
        round_id = current["round_id"]
        variant = variant_of(table["variant"])
        async with self.ctx.store.read() as conn:  # betting has closed: the bets are final
            client_seed, contributions = client_seed_of(await self.load(conn, table, current))
        command: Command
        try:  # one try per step: the next step tries again, so the round deals as soon as the rng answers
            deck = await self.ctx.rng.draw(round_id, variant.deck_size, client_seed, client_seeds=contributions)
            command = Deal(tuple(deck))
        except DomainError as error:
            log.warning("rng draw failed", extra={"round_id": round_id, "error": str(error)})
            command = RngFailed()
        if not await self.decided(table, current, command) and isinstance(command, RngFailed):
            return RNG_RETRY_S
        return None

    async def reveal_next(self, table: Row, current: Row) -> None:
        """Reveal the next part of the variant's reveal plan (``decide``: a ``Tick`` in ``revealing``)."""
        await self.decided(table, current, Tick())


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

    async def check_bet(self, conn: Conn, config: Any, round_id: str, player: str, amount: int) -> None:
        await self.seats.check_bet(conn, config, round_id, player, amount)

    async def reserve(self, conn: Conn, round_id: str, player: str, amount: int, hold_id: str) -> None:
        await self.seats.reserve(conn, round_id, player, amount, hold_id)

    async def release(self, conn: Conn, round_id: str, amount: int) -> None:
        await self.seats.release(conn, round_id, amount)
