"""The bidding-dealer round of 68 NiuNiu, red-envelope bull (``red_envelope_bull``).

    bidding --close_bidding--> betting --close_betting--> dealing --send--> revealing --grab_next x N-->
    settling --settle--> settled
    bidding: no bid -> voided (NO_DEALER); dealing: no bet -> voided (NO_BETS);
    dealing: the rng fails or its split is not one share each -> voided and re-dealt (ENVELOPE_ERROR);
    settling: the dealer grabbed 0.01 -> voided and re-dealt (the variant's void reason)

Each arrow is a step that asks ``decide`` (``round_base.RoundMachine.decided``); this shape adds
what its rows keep (the dealer seated, the grabs, the re-deal mark) to what ``decide`` returns.

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
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from google.protobuf.message import Message
from niuniu.table.v1 import events_pb2 as ev

from backbone.errors import DomainError, FailedPrecondition, Unavailable
from bull.variants.red_envelope_bull import DEALER_VOID, MIN_SHARE_MINOR, EnvelopeTableConfig
from services.table.common import REDEALS, Phase, unix_ms
from services.table.core.commands import Command, RngFailed, Split, Tick
from services.table.core.decide import ENVELOPE_ERROR, client_seed_of
from services.table.core.evolve import Event
from services.table.core.state import RoundState, Sealed
from services.table.round_base import RNG_RETRY_S, Opening, RoundMachine, Step, at_ms, limits_of
from services.table.store import Conn, Row

log = logging.getLogger(__name__)

REDEAL_CAUSES = (ENVELOPE_ERROR.partition(":")[0], DEALER_VOID)
"""The voids after which the next round re-deals this one (``RoundOpened.redeal_of``): the envelope could
not be sent, or the dealer grabbed 0.01 (the variant's void reason)."""


def envelope_config(settings: Any) -> EnvelopeTableConfig:
    return EnvelopeTableConfig.from_settings(settings)


def redeals(voided: ev.RoundVoided) -> bool:
    return voided.reason.partition(":")[0] in REDEAL_CAUSES


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
        await self.decided(table, current, Tick())

    # ------------------------------------------------------------------ bets

    async def check_bet(self, conn: Conn, config: Any, round_id: str, player: str, amount: int) -> None:
        """Not the dealer (a second bet is the admission's: ``one_bet_per_round``)."""
        row = await self.ctx.envelopes.row(conn, round_id)
        if row["dealer"] == player:
            raise FailedPrecondition("DEALER_CANNOT_BET", "the dealer plays against the bettors, not with them")

    # ------------------------------------------------------------------ the envelope

    async def send(self, table: Row, current: Row) -> float | None:
        """Betting closed: the round is voided without a bet (``decide``: a ``Tick`` in ``dealing``); else the
        rng splits the envelope among the dealer and the bettors (one try a step) and ``decide`` sends it
        (``Split``), or, when the rng failed, waits for it or voids the round (``RngFailed``)."""
        if await self.decided(table, current, Tick()):
            return None
        async with self.ctx.store.read() as conn:  # betting has closed: the bets are final
            state = await self.load(conn, table, current)
        command = await self._split(state)
        if not await self.decided(table, current, command) and isinstance(command, RngFailed):
            return RNG_RETRY_S
        return None

    async def _split(self, state: RoundState) -> Command:
        """The rng's split of the envelope for the dealer and the round's bettors, or how it failed: it did not
        answer (the step tries again), or it refused (an envelope error). Its client seed combines the
        players' contributions (docs/fairness.md, section 10)."""
        total = envelope_config(state.settings).rules.envelope_total_minor
        client_seed, contributions = client_seed_of(state)
        try:
            amounts, order = await self.ctx.rng.split_envelope(
                state.round_id, total, 1 + len(state.placed), MIN_SHARE_MINOR, client_seed, client_seeds=contributions
            )
        except Unavailable as error:
            log.warning("rng split failed", extra={"round_id": state.round_id, "error": str(error)})
            return RngFailed()
        except (ValueError, DomainError) as error:
            log.warning("rng refused the split", extra={"round_id": state.round_id, "error": str(error)})
            return RngFailed(refused=True)
        return Split(tuple(amounts), tuple(order))

    async def grab_next(self, table: Row, current: Row) -> None:
        """Reveal the next grab (``decide``: a ``Tick`` in ``revealing``); after the last one the round settles."""
        await self.decided(table, current, Tick())

    # ------------------------------------------------------------------ load and save

    async def sealed(self, conn: Conn, current: Row) -> Sealed:
        return Sealed(grabs=tuple(await self.ctx.envelopes.grabs(conn, current["round_id"])))

    async def save_rows(self, conn: Conn, after: RoundState, event: Message) -> None:
        """Besides the round's row: the dealer seated, the grabs stored, a re-deal marked."""
        envelopes, round_id = self.ctx.envelopes, after.round_id
        if isinstance(event, ev.DealerChosen):
            leader = {"bid_id": event.bid_id, "player": event.dealer, "amount_minor": event.dealer_pool_minor,
                      "hold_id": event.hold_id, "hold_minor": event.hold_minor}  # fmt: skip
            await envelopes.seat_dealer(conn, round_id, leader)
            await self.ctx.store.open_betting(conn, round_id, at_ms(event.betting_closes_at_unix_ms))
        elif isinstance(event, ev.EnvelopeSent):
            await envelopes.insert_grabs(conn, round_id, after.sealed.grabs)
        elif isinstance(event, ev.RoundVoided) and redeals(event):
            await envelopes.mark_redeal(conn, round_id)
        await super().save_rows(conn, after, event)

    def saved(self, state: RoundState, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, ev.RoundVoided) and redeals(event):
                REDEALS.labels(event.reason.partition(":")[0]).inc()
        super().saved(state, events)
