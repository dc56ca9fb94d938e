"""The round's read model: the RoundView GetRound and ListRounds answer and the area totals WatchTable
sends, from the state ``evolve`` folds."""

from __future__ import annotations

from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2

from bull.variants import get
from services.table.core.state import Bet, RoundState


def round_view(state: RoundState, viewer: str, *, privileged: bool) -> table_pb2.RoundView:
    """What ``viewer`` (a player's account) sees of the round; ``privileged`` (an admin or auditor) sees
    every bet. The hands are in deal order (docs/api/frontend/stream.md, card-to-seat order)."""
    seats: tuple[str, ...] = tuple(getattr(get(state.variant), "deal_order", ()))  # red envelope: no hands
    deal = {seat: n for n, seat in enumerate(seats)}
    hands = sorted(state.hands, key=lambda hand: deal.get(hand.seat, len(deal)))  # stable: parts stay in order
    settled = state.settled or ev.RoundSettled()
    return table_pb2.RoundView(
        table_id=state.table_id,
        round_id=state.round_id,
        round_no=state.round_no,
        phase=state.phase,
        commitment=state.commitment,
        betting_closes_at_unix_ms=state.betting_closes_at_ms,
        hands=hands,
        area_totals_minor={area: stake for area, stake in state.staked if stake},
        my_bets=[_outcome(b, settled) for b in state.bets if privileged or b.player == viewer],
        server_seed=state.server_seed,
        client_seed=state.client_seed if state.server_seed else "",
        area_outcomes=settled.area_outcomes,
        area_odds=settled.area_odds,
        variant=state.variant,
        config=state.settings,
        dealer=state.dealer,
        dealer_pool_minor=state.dealer_pool_minor,
        highest_bid_minor=state.highest_bid_minor,
        grabs=state.grabs,
        envelope_total_minor=state.envelope_total_minor,
        redeal_of=state.redeal_of,
        void_reason=state.void_reason,
        client_seeds=contributions(state, viewer),
        envelope_min_minor=state.envelope_min_minor,
    )


def watched_area_totals(state: RoundState) -> table_pb2.AreaTotals:
    """The AreaTotals a watcher is sent after a bet event: the stakes by area and the number of bets not
    cancelled. Unlike the RoundView's, every area bet on in the round is listed: an area whose bets were all
    cancelled stays, at 0, so a client replacing its totals shows it emptied."""
    return table_pb2.AreaTotals(totals_minor=dict(state.staked), bets=state.live_bets)


def counted(client_seed: str, status: str, round_client_seed: str) -> bool:
    """Whether a bet's client seed contribution entered its round's client seed, at any time after the deal.

    A bet is cancelled only in its betting window and no other status change drops a bet before the
    deal, so every bet with a contribution not cancelled counted, if the round was dealt with
    contributions (its client seed, recorded at the deal, is not empty): a round voided before its
    deal combined none.
    """
    return bool(client_seed) and status != "cancelled" and bool(round_client_seed)


def contributions(state: RoundState, viewer: str) -> list[table_pb2.ClientSeedContribution]:
    """The round's client seed contributions, bet by bet, once its seed is revealed (none before)."""
    if not state.server_seed:
        return []
    return [
        table_pb2.ClientSeedContribution(
            bet_id=b.bet_id,
            client_seed=b.client_seed,
            counted=counted(b.client_seed, b.status, state.client_seed),
            mine=b.player == viewer,
        )
        for b in state.bets
        if b.client_seed
    ]


def _outcome(bet: Bet, settled: ev.RoundSettled) -> ev.BetOutcome:
    return ev.BetOutcome(
        bet_id=bet.bet_id,
        player=bet.player,
        area=bet.area,
        stake_minor=bet.stake_minor,
        outcome=bet.outcome or bet.status,
        net_minor=bet.net_minor,
        hold_id=bet.hold_id,
        odds=settled.area_odds.get(bet.area, "") if bet.status == "settled" else "",
    )
