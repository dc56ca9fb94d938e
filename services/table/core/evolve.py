"""``evolve``: one event folded into a round's state; ``fold_table``: a table's events into its rounds.

Every event of a round is one of the table's wire events (``niuniu.table.v1.events``) or a
private fact of the core (``Sealed``, ``Scheduled``). An event of another kind leaves the state
as it is, so a fold over a table's whole record (its stream, its bets' streams and its banker
stream, in position order) is safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import reduce
from typing import Any

from google.protobuf.message import Message
from niuniu.table.v1 import events_pb2 as ev

from bull.variants import get
from services.table.core.state import Bet, Bid, Phase, RoundState, Scheduled, Sealed

Event = Message | Sealed | Scheduled
"""What ``decide`` emits and ``evolve`` folds: a wire event, or a private fact of the round."""

EVENT_TYPES: dict[str, type[Message]] = {
    "table.created": ev.TableCreated,
    "table.config_changed": ev.ConfigChanged,
    "table.round_opened": ev.RoundOpened,
    "table.bid_placed": ev.BidPlaced,
    "table.dealer_chosen": ev.DealerChosen,
    "table.bet_placed": ev.BetPlaced,
    "table.bet_cancelled": ev.BetCancelled,
    "table.bet_changed": ev.BetChanged,
    "table.betting_closed": ev.BettingClosed,
    "table.dealt": ev.Dealt,
    "table.envelope_sent": ev.EnvelopeSent,
    "table.hand_revealed": ev.HandRevealed,
    "table.envelope_grabbed": ev.EnvelopeGrabbed,
    "table.round_settled": ev.RoundSettled,
    "table.round_voided": ev.RoundVoided,
    "table.seed_revealed": ev.SeedRevealed,
}
"""The stored event types a round's state is folded from, and their payloads (others leave it as it is)."""


def evolve(state: RoundState, event: Event) -> RoundState:
    """The round after ``event``."""
    handler = _HANDLERS.get(type(event))
    return state if handler is None else handler(state, event)


def fold_round(state: RoundState, events: Iterable[Event]) -> RoundState:
    return reduce(evolve, events, state)


def fold_table(events: Iterable[Message]) -> dict[str, RoundState]:
    """Every round of a table from its events in position order (its TableCreated first)."""
    table: ev.TableCreated | None = None
    config: tuple[tuple[str, str], ...] = ()
    limits = ev.TableLimits()
    rounds: dict[str, RoundState] = {}
    for event in events:
        if isinstance(event, ev.TableCreated):
            table, config, limits = event, tuple(sorted(event.config.items())), event.limits
        elif isinstance(event, ev.ConfigChanged):
            config, limits = tuple(sorted(event.config.items())), event.limits
        elif isinstance(event, ev.RoundOpened):
            assert table is not None, "a round opens at a table created before it"
            start = RoundState(event.table_id, event.round_id, table.variant, config, limits)
            rounds[event.round_id] = evolve(start, event)
        elif (round_id := getattr(event, "round_id", "")) in rounds:
            rounds[round_id] = evolve(rounds[round_id], event)
    return rounds


def _opened(state: RoundState, e: ev.RoundOpened) -> RoundState:
    return replace(
        state,
        round_no=e.round_no,
        phase=Phase.BIDDING if e.bidding_closes_at_unix_ms else Phase.BETTING,
        commitment=e.commitment,
        betting_closes_at_ms=e.betting_closes_at_unix_ms,
        bidding_closes_at_ms=e.bidding_closes_at_unix_ms,
        redeal_of=e.redeal_of,
        dealer=e.banker,
        dealer_hold_id=e.banker_hold_id,
        dealer_hold_minor=e.banker_capital_minor,
        table_cap_minor=e.table_cap_minor,
    )


def _bid(state: RoundState, e: ev.BidPlaced) -> RoundState:
    bid = Bid(e.bid_id, e.player, e.amount_minor, e.hold_minor, e.hold_id)
    return replace(state, bids=(*state.bids, bid))


def _dealer_chosen(state: RoundState, e: ev.DealerChosen) -> RoundState:
    return replace(
        state,
        phase=Phase.BETTING,
        dealer=e.dealer,
        dealer_hold_id=e.hold_id,
        dealer_hold_minor=e.hold_minor,
        dealer_pool_minor=e.dealer_pool_minor,
        betting_closes_at_ms=e.betting_closes_at_unix_ms,
    )


def _bet(state: RoundState, e: ev.BetPlaced) -> RoundState:
    bet = Bet(e.bet_id, e.player, e.area, e.stake_minor, e.hold_minor, e.hold_id, e.client_seed)
    staked = _restaked(state.staked, e.area, e.stake_minor)
    return replace(state, bets=(*state.bets, bet), staked=staked, live_bets=state.live_bets + 1)


def with_bets(state: RoundState, bets: Iterable[Bet]) -> RoundState:
    """``state`` with ``bets`` as another record holds them (the store's rows, in its order), its area stakes
    and live bets counted from them."""
    bets = tuple(bets)
    totals: dict[str, int] = {}
    for bet in bets:
        totals[bet.area] = totals.get(bet.area, 0) + (bet.stake_minor if bet.status != "cancelled" else 0)
    live = sum(bet.status != "cancelled" for bet in bets)
    return replace(state, bets=bets, staked=tuple(totals.items()), live_bets=live)


def _restaked(staked: tuple[tuple[str, int], ...], area: str, delta: int) -> tuple[tuple[str, int], ...]:
    totals = dict(staked)
    totals[area] = totals.get(area, 0) + delta
    return tuple(totals.items())


def _with_bet(state: RoundState, bet_id: str, **changes: Any) -> RoundState:
    """The bet ``bet_id`` changed as ``changes`` say, the area stakes with it (a cancelled bet counts no more)."""
    bets, staked, live = [], state.staked, state.live_bets
    for bet in state.bets:
        if bet.bet_id == bet_id and bet.status != "cancelled":
            after = replace(bet, **changes)
            counted = after.stake_minor if after.status != "cancelled" else 0
            staked = _restaked(staked, bet.area, counted - bet.stake_minor)
            live -= after.status == "cancelled"
            bet = after
        bets.append(bet)
    return replace(state, bets=tuple(bets), staked=staked, live_bets=live)


def _cancelled(state: RoundState, e: ev.BetCancelled) -> RoundState:
    return _with_bet(state, e.bet_id, status="cancelled")


def _changed(state: RoundState, e: ev.BetChanged) -> RoundState:
    return _with_bet(state, e.bet_id, stake_minor=e.stake_minor, hold_minor=e.hold_minor, hold_id=e.hold_id)


def _betting_closed(state: RoundState, e: ev.BettingClosed) -> RoundState:
    return replace(state, phase=Phase.DEALING)


def _dealt(state: RoundState, e: ev.Dealt) -> RoundState:
    planned = len(get(state.variant).reveal_plan({}))  # a card game's plan is its seats and groups
    return replace(state, phase=Phase.REVEALING, client_seed=e.client_seed, reveals_planned=planned)


def _sent(state: RoundState, e: ev.EnvelopeSent) -> RoundState:
    return replace(
        state,
        phase=Phase.REVEALING,
        client_seed=e.client_seed,
        reveals_planned=e.shares,
        envelope_total_minor=e.total_minor,
        envelope_min_minor=e.min_minor,
    )


def _after_reveal(state: RoundState) -> RoundState:
    return replace(state, phase=Phase.SETTLING) if state.reveals_done >= state.reveals_planned else state


def _revealed(state: RoundState, e: ev.HandRevealed) -> RoundState:
    return _after_reveal(replace(state, hands=(*state.hands, e)))


def _grabbed(state: RoundState, e: ev.EnvelopeGrabbed) -> RoundState:
    return _after_reveal(replace(state, grabs=(*state.grabs, e)))


def _settled(state: RoundState, e: ev.RoundSettled) -> RoundState:
    outcomes = {o.bet_id: o for o in e.bets}

    def settle(bet: Bet) -> Bet:
        if bet.status != "placed":
            return bet
        if (o := outcomes.get(bet.bet_id)) is None:  # left out of the settlement: refunded (coverage.py)
            return replace(bet, status="refunded", outcome="refund", net_minor=0)
        return replace(bet, status="settled", outcome=o.outcome, net_minor=o.net_minor)

    return replace(state, phase=Phase.SETTLED, settled=e, bets=tuple(settle(b) for b in state.bets))


def _voided(state: RoundState, e: ev.RoundVoided) -> RoundState:
    """Every bet in play (or settled, for a settlement the wallet refused) is refunded."""
    bets = tuple(
        replace(b, status="refunded", outcome="refund", net_minor=0) if b.status in ("placed", "settled") else b
        for b in state.bets
    )
    return replace(state, phase=Phase.VOIDED, void_reason=e.reason, bets=bets)


def _seed(state: RoundState, e: ev.SeedRevealed) -> RoundState:
    return replace(state, server_seed=e.server_seed)


def _sealed(state: RoundState, e: Sealed) -> RoundState:
    return replace(state, sealed=e)


def _scheduled(state: RoundState, e: Scheduled) -> RoundState:
    return replace(state, next_step_at_ms=e.at_ms)


_HANDLERS: dict[type, Callable[[RoundState, Any], RoundState]] = {
    ev.RoundOpened: _opened,
    ev.BidPlaced: _bid,
    ev.DealerChosen: _dealer_chosen,
    ev.BetPlaced: _bet,
    ev.BetCancelled: _cancelled,
    ev.BetChanged: _changed,
    ev.BettingClosed: _betting_closed,
    ev.Dealt: _dealt,
    ev.EnvelopeSent: _sent,
    ev.HandRevealed: _revealed,
    ev.EnvelopeGrabbed: _grabbed,
    ev.RoundSettled: _settled,
    ev.RoundVoided: _voided,
    ev.SeedRevealed: _seed,
    Sealed: _sealed,
    Scheduled: _scheduled,
}
