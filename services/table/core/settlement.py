"""A revealed round's hands, its funding, and its RoundSettled (the wallet's contract)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from niuniu.table.v1 import events_pb2 as ev

from bull.cards import parse_cards
from bull.money import Settlement
from bull.variants import EnvelopeSplit, Funding, RoundShape, SeatHand, TableBet, get
from bull.variants.red_envelope_bull import DEALER_SEAT
from services.table.core.state import Grab, RoundState


def settlement_event(
    table_id: str,
    round_id: str,
    variant: str,
    settlement: Settlement,
    hold_ids: Sequence[str],
    bet_holds: Mapping[str, str],
    area_odds: Mapping[str, str] | None = None,
    jackpot_pool_minor: int | None = None,
) -> ev.RoundSettled:
    """The wallet's contract: every transfer and the hold it is paid from, and every hold of the round."""
    transfers = [
        ev.SettlementTransfer(
            payer=t.payer,
            payee=t.payee,
            amount_minor=t.amount_minor,
            kind=str(t.kind),
            bet_id=t.bet_id or "",
            hold_id=t.hold_id,
        )
        for t in settlement.transfers
    ]
    outcomes = [
        ev.BetOutcome(
            bet_id=r.bet_id,
            player=r.player,
            area=r.area,
            stake_minor=r.stake_minor,
            outcome=str(r.outcome),
            net_minor=r.net_minor,
            hold_id=bet_holds[r.bet_id],
            odds=(area_odds or {}).get(r.area, ""),
        )
        for r in settlement.bets
    ]
    return ev.RoundSettled(
        table_id=table_id,
        round_id=round_id,
        variant=variant,
        bets=outcomes,
        transfers=transfers,
        hold_ids=list(hold_ids),
        jackpot_pool_minor=jackpot_pool_minor,
    )


def split_of(grabs: Sequence[Grab]) -> EnvelopeSplit:
    """An envelope's grabs as the variant's deal input."""
    seats = {g.position: g.bet_id or DEALER_SEAT for g in grabs}
    return EnvelopeSplit(
        tuple(seats[p] for p in range(len(grabs))),
        tuple(g.amount_minor for g in grabs),
        tuple(g.position for g in grabs),
    )


def hands_of(state: RoundState) -> dict[str, SeatHand]:
    """The round's hands from its sealed deck or grabs (a round dealt, not necessarily revealed)."""
    variant = get(state.variant)
    config = variant.parse_config(state.settings)
    if variant.deck_size:
        return variant.deal(parse_cards(state.sealed.deck), config)
    return variant.deal(split_of(state.sealed.grabs), config)


def funding_of(state: RoundState) -> tuple[Funding, list[str]]:
    """Who deals or banks the round, from which hold; and the holds it releases besides its bets'."""
    if not state.dealer:
        return Funding(), [b.hold_id for b in state.bids]
    funding = Funding(state.dealer, state.dealer_hold_id, state.dealer_hold_minor, state.dealer_pool_minor)
    if get(state.variant).shape is RoundShape.BIDDING_DEALER:
        return funding, [b.hold_id for b in state.bids]  # every bid's hold, the dealer's included
    return funding, [state.dealer_hold_id]


def live_bets(state: RoundState, refunded: frozenset[str] = frozenset()) -> list[TableBet]:
    return [
        TableBet(b.bet_id, b.player, b.area, b.stake_minor, b.hold_id) for b in state.placed if b.bet_id not in refunded
    ]


def settled_event(
    state: RoundState, hands: Mapping[str, SeatHand], refunded: frozenset[str], pool_minor: int | None
) -> ev.RoundSettled:
    """The round's RoundSettled: ``pool_minor`` is the jackpot pool's payable balance when it is claimed."""
    variant = get(state.variant)
    config = variant.parse_config(state.settings)
    live = live_bets(state, refunded)
    funding, besides = funding_of(state)
    claims = variant.claims_jackpot_pool(hands, live, config)
    if claims:
        funding = replace(funding, jackpot_pool_minor=pool_minor or 0)
    settlement = variant.settle(hands, live, config, funding)
    odds = variant.area_odds(hands, config)
    settled = settlement_event(
        state.table_id,
        state.round_id,
        variant.variant_id,
        settlement,
        [b.hold_id for b in state.bets] + besides,
        {b.bet_id: b.hold_id for b in state.bets},
        odds,
        (pool_minor or 0) if claims else None,
    )
    settled.area_outcomes.update(variant.area_outcomes(hands, config, settlement))
    settled.area_odds.update(odds)
    return settled
