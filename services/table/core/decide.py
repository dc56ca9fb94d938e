"""``decide``: what a command, or the passing of time, does to a round: the events it causes.

Pure: the round's state, the command and the time (``now_ms``, unix ms) come in, the events go
out; a command the round's phase does not take causes none. The wire events are what the
machines append to the table's stream; ``Sealed`` and ``Scheduled`` are what they store with
the round's row. The Variant (``bull.variants``) decides the game (the deal, the reveal plan,
whether the hands void the round, the settlement); ``decide`` decides when.

The live machines (``round_base.RoundMachine.decided``) call it for every step of a round once
it has opened: ``Tick``, ``Deal``, ``Split``, ``RngFailed``, ``Settle`` and ``Void``. The players'
commands (``PlaceBet``, ``CancelBet``, ``ChangeBet``, ``PlaceBid``) are not yet sent here by the
table: ``bets.py`` and ``envelope_commands.py`` admit and record them under the same rules,
which these handlers state for the Hypothesis tests (tests/table/test_round_core.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from niuniu.table.v1 import events_pb2 as ev

from bull import fairness
from bull.cards import parse_cards
from bull.rules import red_envelope as re_
from bull.variants import EnvelopeSplit, Variant, decimal_text, get
from bull.variants import baibian_bull as bbv
from bull.variants.red_envelope_bull import DEALER_SEAT, MIN_SHARE_MINOR
from services.table.core.commands import (
    CancelBet,
    ChangeBet,
    Command,
    Deal,
    PlaceBet,
    PlaceBid,
    RngFailed,
    Settle,
    Split,
    Tick,
    Void,
)
from services.table.core.evolve import Event
from services.table.core.settlement import funding_of, hands_of, settled_event
from services.table.core.state import Grab, Phase, RoundState, Scheduled, Sealed

RNG_PATIENCE_MS = 20_000
"""How long after betting closed a round waits for the rng to deal (or split) before it is voided."""
NO_DEALER = "NO_DEALER: nobody bid for the dealer seat"
NO_BETS = "NO_BETS: nobody bet against the dealer"
ENVELOPE_ERROR = "ENVELOPE_ERROR: the red envelope could not be sent"
RNG_DOWN = "the rng service could not deal the round"


def decide(state: RoundState, command: Command, now_ms: int) -> list[Event]:
    """The events ``command`` causes at ``now_ms`` (none: the round does not take it now)."""
    if state.phase in Phase.ENDED:
        return []
    handler = _HANDLERS[type(command)]
    return handler(state, command, now_ms)


def voided(state: RoundState, reason: str) -> ev.RoundVoided:
    """The round ended with every hold released: its bets', and the dealer's, banker's or bidders'."""
    _, besides = funding_of(state)
    holds = [b.hold_id for b in state.bets] + besides
    return ev.RoundVoided(table_id=state.table_id, round_id=state.round_id, reason=reason, hold_ids=holds)


def client_seed_of(state: RoundState) -> tuple[str, list[str]]:
    """The round's client seed when betting has closed, and the contributions it combines."""
    contributions = [b.client_seed for b in state.placed if b.client_seed]
    return fairness.combine_client_seeds(contributions), contributions


def grab_event(state: RoundState, grab: Grab) -> ev.EnvelopeGrabbed:
    config = get(state.variant).parse_config(state.settings)
    hand = re_.evaluate(grab.amount_minor)
    return ev.EnvelopeGrabbed(
        table_id=state.table_id,
        round_id=state.round_id,
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


def _tick(state: RoundState, command: Tick, now: int) -> list[Event]:
    if state.phase == Phase.BIDDING and now >= state.bidding_closes_at_ms:
        return _close_bidding(state, now)
    if state.phase == Phase.BETTING and now >= state.betting_closes_at_ms:
        placed = state.placed
        total = sum(b.stake_minor for b in placed)
        return [ev.BettingClosed(table_id=state.table_id, round_id=state.round_id, bets=len(placed),
                                 total_stake_minor=total)]  # fmt: skip
    if state.phase == Phase.DEALING and not get(state.variant).deck_size and not state.placed:
        return [voided(state, NO_BETS)]
    if state.phase == Phase.REVEALING and now >= state.next_step_at_ms:
        return _reveal_next(state, now)
    return []


def _close_bidding(state: RoundState, now: int) -> list[Event]:
    leader = state.leading_bid
    if leader is None:
        return [voided(state, NO_DEALER)]
    chosen = ev.DealerChosen(
        table_id=state.table_id,
        round_id=state.round_id,
        dealer=leader.player,
        bid_id=leader.bid_id,
        dealer_pool_minor=leader.amount_minor,
        hold_id=leader.hold_id,
        hold_minor=leader.hold_minor,
        betting_closes_at_unix_ms=now + state.limits.betting_seconds * 1000,
        bids=len(state.bids),
    )
    return [chosen]


def _place_bet(state: RoundState, command: PlaceBet, now: int) -> list[Event]:
    bet = command.bet
    if state.phase != Phase.BETTING or now >= state.betting_closes_at_ms:
        return []
    if any(b.bet_id == bet.bet_id for b in state.bets):
        return []  # a retry of a recorded bet
    placed = ev.BetPlaced(
        table_id=state.table_id,
        round_id=state.round_id,
        bet_id=bet.bet_id,
        player=bet.player,
        area=bet.area,
        stake_minor=bet.stake_minor,
        hold_minor=bet.hold_minor,
        hold_id=bet.hold_id,
        client_seed=bet.client_seed,
    )
    return [placed]


def _open_bet(state: RoundState, bet_id: str, now: int) -> Any:
    if state.phase != Phase.BETTING or now >= state.betting_closes_at_ms:
        return None
    return next((b for b in state.placed if b.bet_id == bet_id), None)


def _cancel_bet(state: RoundState, command: CancelBet, now: int) -> list[Event]:
    bet = _open_bet(state, command.bet_id, now)
    if bet is None:
        return []
    return [ev.BetCancelled(table_id=state.table_id, round_id=state.round_id, bet_id=bet.bet_id,
                            player=bet.player, cause=command.cause)]  # fmt: skip


def _change_bet(state: RoundState, command: ChangeBet, now: int) -> list[Event]:
    bet = _open_bet(state, command.bet_id, now)
    if bet is None or get(state.variant).deck_size:
        return []
    changed = ev.BetChanged(
        table_id=state.table_id,
        round_id=state.round_id,
        bet_id=bet.bet_id,
        player=bet.player,
        area=bet.area,
        previous_stake_minor=bet.stake_minor,
        stake_minor=command.stake_minor,
        hold_minor=command.hold_minor,
        hold_id=command.hold_id,
    )
    return [changed]


def _place_bid(state: RoundState, command: PlaceBid, now: int) -> list[Event]:
    bid, leader = command.bid, state.leading_bid
    if state.phase != Phase.BIDDING or now >= state.bidding_closes_at_ms or bid.amount_minor <= state.highest_bid_minor:
        return []
    placed = ev.BidPlaced(
        table_id=state.table_id,
        round_id=state.round_id,
        bid_id=bid.bid_id,
        player=bid.player,
        amount_minor=bid.amount_minor,
        hold_minor=bid.hold_minor,
        hold_id=bid.hold_id,
        outbid_bid_id=leader.bid_id if leader else "",
    )
    return [placed]


def _next_reveal(state: RoundState, now: int) -> Scheduled:
    return Scheduled(now + state.limits.reveal_interval_ms)


def _deal(state: RoundState, command: Deal, now: int) -> list[Event]:
    variant = get(state.variant)
    if state.phase != Phase.DEALING or not variant.deck_size:
        return []
    client_seed, _ = client_seed_of(state)
    dealt = ev.Dealt(
        table_id=state.table_id,
        round_id=state.round_id,
        deck_size=variant.deck_size,
        cards_dealt=variant.cards_dealt,
        client_seed=client_seed,
    )
    if variant.variant_id == bbv.BAIBIAN_BULL.variant_id:  # the drawn card is shown and burned
        config = bbv.BAIBIAN_BULL.parse_config(state.settings)  # the same variant, its config typed
        dealt.drawn_card, dealt.first_seat = bbv.deal_facts(parse_cards(command.deck), config)
    return [Sealed(deck=tuple(command.deck)), dealt, _next_reveal(state, now)]


def _split(state: RoundState, command: Split, now: int) -> list[Event]:
    variant = get(state.variant)
    if state.phase != Phase.DEALING or variant.deck_size:
        return []
    bets = state.placed
    if not bets:
        return [voided(state, NO_BETS)]
    participants = [state.dealer, *(b.player for b in bets)]
    seats = (DEALER_SEAT, *(b.bet_id for b in bets))
    try:
        hands = variant.deal(EnvelopeSplit(seats, command.amounts, command.grab_order), variant.parse_config(
            state.settings))  # fmt: skip
    except ValueError:
        return [voided(state, ENVELOPE_ERROR)]
    grabs = tuple(
        Grab(k, seats.index(seat), participants[seats.index(seat)], "" if seat == DEALER_SEAT else seat,
             hands[seat].amount_minor)
        for k, (seat, _) in enumerate(variant.reveal_plan(hands))
    )  # fmt: skip
    config = variant.parse_config(state.settings)
    sent = ev.EnvelopeSent(
        table_id=state.table_id,
        round_id=state.round_id,
        total_minor=config.rules.envelope_total_minor,
        shares=len(participants),
        min_minor=MIN_SHARE_MINOR,
        client_seed=client_seed_of(state)[0],
        participants=participants,
    )
    return [Sealed(grabs=grabs), sent, _next_reveal(state, now)]


def _rng_failed(state: RoundState, command: RngFailed, now: int) -> list[Event]:
    deals = bool(get(state.variant).deck_size)
    if state.phase != Phase.DEALING:
        return []
    if now < state.betting_closes_at_ms + RNG_PATIENCE_MS and (deals or not command.refused):
        return []
    return [voided(state, RNG_DOWN if deals else ENVELOPE_ERROR)]


def _void(state: RoundState, command: Void, now: int) -> list[Event]:
    return [voided(state, command.reason)]


def _reveal_next(state: RoundState, now: int) -> list[Event]:
    variant: Variant[Any] = get(state.variant)
    done = state.reveals_done
    if not variant.deck_size:
        grabs = state.sealed.grabs
        return [grab_event(state, grabs[done]), _next_reveal(state, now)] if done < len(grabs) else []
    hands = hands_of(state)
    plan = variant.reveal_plan(hands)
    if done >= len(plan):
        return []
    seat, group = plan[done]
    config = variant.parse_config(state.settings)
    hand = variant.reveal_part(hands[seat], group, config)
    completes = bool(group) and group == variant.reveal_groups[-1]  # a hand shown in parts is whole at its last
    revealed = ev.HandRevealed(
        table_id=state.table_id,
        round_id=state.round_id,
        seat=seat,
        cards=[card.code for card in hand.cards],
        category=hand.category,
        points=hand.points,
        multiplier=decimal_text(hand.multiplier),
        group=group,
        hand_category=hands[seat].category if completes else "",
    )
    return [revealed, _next_reveal(state, now)]


def _settle(state: RoundState, command: Settle, now: int) -> list[Event]:
    if state.phase != Phase.SETTLING:
        return []
    hands = hands_of(state)
    variant = get(state.variant)
    reason = variant.void_reason(hands, variant.parse_config(state.settings))
    if reason:
        return [voided(state, reason)]
    return [settled_event(state, hands, command.refunded, command.pool_minor)]


_HANDLERS: dict[type, Callable[[RoundState, Any, int], list[Event]]] = {
    Tick: _tick,
    PlaceBet: _place_bet,
    CancelBet: _cancel_bet,
    ChangeBet: _change_bet,
    PlaceBid: _place_bid,
    Deal: _deal,
    Split: _split,
    RngFailed: _rng_failed,
    Settle: _settle,
    Void: _void,
}
