"""The one settle of the dealer-against-areas games, checked on its own terms for both of them.

Over random decks, bets and configurations of Golden Bull and 百變牛牛, the shared settle
conserves money (recounted here from the transfers, not only by ``Settlement.check``), rounds each
bet toward the dealer by less than one minor unit with the fraction recorded, never takes more
than the hold, sends commission only where the game has one, and records every bet with the
outcome ``area_outcomes`` announces for its area.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import permutations
from math import floor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bull.cards import DECK_52, DECK_54, Card, parse_cards
from bull.money import COMMISSION_REVENUE, Outcome, Settlement, TransferKind
from bull.rules import against_dealer
from bull.rules import baibian_bull as bb
from bull.rules import golden_bull as gb

DEALER = "player:dealer"
MULTIPLIERS = st.fractions(min_value=Fraction(1, 1000), max_value=Fraction(1000), max_denominator=1000)


@dataclass(frozen=True)
class Game:
    """One variant as the property drives it."""

    module: Any
    deck: Sequence[Card]
    configs: st.SearchStrategy[Any]
    settle: Callable[..., Settlement]  # the variant's public settle, the thin caller
    gross: Callable[[Any, Any, Fraction, Any], Fraction]  # (area, dealer, stake, config) -> a win's pay


GOLDEN = Game(
    gb,
    DECK_52,
    st.builds(
        gb.GoldenBullConfig,
        mode=st.sampled_from(list(gb.Mode)),
        multipliers=st.lists(MULTIPLIERS, min_size=len(gb.CATEGORIES), max_size=len(gb.CATEGORIES)).map(tuple),
        enabled=st.frozensets(st.sampled_from(gb.SPECIALS)),
        suit_order=st.sampled_from(["".join(p) for p in permutations("SHCD")]),
        suit_tiebreak=st.booleans(),
        exact_tie=st.sampled_from(list(gb.ExactTie)),
        commission_bps=st.one_of(st.sampled_from([0, 10_000]), st.integers(0, 10_000)),
        bomb_order=st.sampled_from(list(gb.BombOrder)),
    ),
    lambda *args: gb.settle(*args, dealer_party=DEALER),
    # The dealer pays stake x the area's multiplier; commission then takes it down to the net.
    lambda area, dealer, stake, config: (
        stake * config.multiplier(area.category) if gb.outcome(area, dealer, config) is Outcome.WIN else Fraction(0)
    ),
)
BAIBIAN = Game(
    bb,
    DECK_54,
    st.builds(
        bb.BaibianBullConfig,
        multipliers=st.lists(MULTIPLIERS, min_size=len(bb.CATEGORIES), max_size=len(bb.CATEGORIES)).map(tuple),
        bomb_order=st.sampled_from(list(bb.BombOrder)),
    ),
    lambda *args: bb.settle(*args, banker_party=DEALER),
    lambda area, dealer, stake, config: max(bb.net_exact(area, dealer, stake, config), Fraction(0)),  # no commission
)


@st.composite
def rounds(draw: st.DrawFn, game: Game) -> tuple[Any, list[Card], list[list[Card]], list[Any]]:
    config = draw(game.configs)
    deck = draw(st.permutations(game.deck))
    hands = [list(deck[i : i + 5]) for i in range(0, 5 * (1 + len(game.module.AREAS)), 5)]
    stakes = st.one_of(st.integers(1, 20), st.integers(1, 10**9))
    bet = st.tuples(st.sampled_from(["p1", "p2", "p3"]), st.sampled_from(game.module.AREAS), stakes)
    bets = draw(st.lists(bet, max_size=10))
    return config, hands[0], hands[1:], [game.module.Bet(f"b{i}", *bet) for i, bet in enumerate(bets)]


def check_round(game: Game, drawn: tuple[Any, list[Card], list[list[Card]], list[Any]]) -> None:
    config, dealer_cards, area_cards, bets = drawn
    module = game.module
    settlement = against_dealer.settle(module.AGAINST_DEALER, config, dealer_cards, area_cards, bets, DEALER)
    assert game.settle(dealer_cards, area_cards, bets, config) == settlement
    assert [result.bet_id for result in settlement.bets] == [bet.bet_id for bet in bets]
    flows = check_conserved(settlement, bets)

    # Each bet: the announced outcome, rounded toward the dealer by under one unit, within its hold,
    # paid its gross rounded down by the dealer, less commission down to its net.
    announced = module.area_outcomes(dealer_cards, area_cards, config)
    dealer = module.evaluate(dealer_cards, config)
    hands = dict(zip(module.AREAS, (module.evaluate(cards, config) for cards in area_cards), strict=True))
    remainders = {bet_id: Fraction(n, d) for bet_id, n, d in settlement.remainders}
    for bet, result in zip(bets, settlement.bets, strict=True):
        assert result.outcome is announced[bet.area]
        stake = Fraction(bet.stake_minor)
        exact = module.net_exact(hands[bet.area], dealer, stake, config)
        assert 0 <= exact - result.net_minor < 1
        assert remainders.get(bet.bet_id, Fraction(0)) == exact - result.net_minor
        sign = (result.net_minor > 0) - (result.net_minor < 0)
        expected = {Outcome.WIN: 1, Outcome.PUSH: 0, Outcome.LOSS: -1}[result.outcome]
        assert sign == expected or (expected == 1 and result.net_minor == 0)  # a win under one unit
        assert result.hold_minor == module.hold_minor(bet.stake_minor, config) >= -result.net_minor
        won, lost, commission = flows[bet.bet_id]
        assert won - lost - commission == result.net_minor
        assert won == (floor(game.gross(hands[bet.area], dealer, stake, config)) if result.net_minor >= 0 else 0)
        assert lost == max(-result.net_minor, 0)


def check_conserved(settlement: Settlement, bets: list[Any]) -> dict[str, tuple[int, int, int]]:
    """Nothing is created or lost and every transfer is one bet's: bet id -> (won, lost, commission)."""
    players = {bet.bet_id: bet.player for bet in bets}
    flows = {bet.bet_id: [0, 0, 0] for bet in bets}
    for transfer in settlement.transfers:
        player = players[transfer.bet_id]
        moves = {
            (DEALER, player, TransferKind.WIN): 0,
            (player, DEALER, TransferKind.LOSS): 1,
            (player, COMMISSION_REVENUE, TransferKind.COMMISSION): 2,
        }
        flows[transfer.bet_id][moves[transfer.payer, transfer.payee, transfer.kind]] += transfer.amount_minor
    parties = settlement.net_by_party()
    assert sum(parties.values()) == 0
    commission = parties.get(COMMISSION_REVENUE, 0)
    assert commission == sum(flow[2] for flow in flows.values()) >= 0
    assert parties.get(DEALER, 0) == -sum(bet.net_minor for bet in settlement.bets) - commission
    return {bet_id: (won, lost, taken) for bet_id, (won, lost, taken) in flows.items()}


@pytest.mark.parametrize("game", [GOLDEN, BAIBIAN], ids=["golden_bull", "baibian_bull"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_shared_settle_conserves_money_and_agrees_with_area_outcomes(game: Game, data: st.DataObject) -> None:
    check_round(game, data.draw(rounds(game)))


def test_a_win_worth_less_than_one_unit_nets_nothing_and_records_its_fraction() -> None:
    """Golden Bull's Five Small at x1/1000 on a stake of 7: the dealer owes 7/1000, pays 0."""
    dealer = parse_cards("KS KH KD KC QS")
    areas = [parse_cards(hand) for hand in ("3S 7H TD 5C 4D", "2S 8H 9D 6C 4S", "AS AH AC AD 2H")]
    config = gb.GoldenBullConfig(multipliers=(Fraction(1, 1000), *gb.DEFAULT_MULTIPLIERS[1:]))
    settlement = gb.settle(dealer, areas, [gb.Bet("b", "p", "area_3", 7)], config)
    (bet,) = settlement.bets
    assert bet.outcome is Outcome.WIN and bet.net_minor == 0 and settlement.transfers == ()
    assert settlement.remainders == (("b", 7, 1000),)


def test_the_counterparty_is_named_in_the_error() -> None:
    dealer, *areas = ([card for card in DECK_54 if not card.is_joker][i : i + 5] for i in range(0, 25, 5))
    with pytest.raises(ValueError, match="the banker cannot bet against itself"):
        bb.settle(dealer, areas, [bb.Bet("b", "x", "heaven", 1)], banker_party="x")
    with pytest.raises(ValueError, match="the dealer cannot bet against itself"):
        gb.settle(dealer, areas[:3], [gb.Bet("b", "x", "area_1", 1)], dealer_party="x")
