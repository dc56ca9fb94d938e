"""One settle for the games whose bets play areas against the dealer (Golden Bull, 百變牛牛).

Every bet names an area; the area's hand is compared with the dealer's (the
banker's, in 百變牛牛) and the bet nets its stake times a multiplier. The games
differ only in what ``AgainstDealer`` states: their areas, how a hand nets
(``net_exact``), what a won bet is paid before commission (``gross_win``), the
hold and what error messages call the dealer. The money rule is this module's:

- A bet nets its exact net rounded down: a win toward the dealer, a loss
  rounded up toward the dealer too. What rounding moved is recorded in
  ``Settlement.remainders`` as a fraction of one minor unit, never dropped.
- A won bet is paid its gross, rounded down, by the dealer; commission, to
  ``COMMISSION_REVENUE``, is what separates that gross from the rounded net.
  A game without commission pays the net itself.
- Transfers follow the bets' order: a win, then its commission; or a loss.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import floor
from typing import Generic, Protocol, TypeVar

from bull.cards import Card, check_distinct
from bull.money import COMMISSION_REVENUE, BetResult, Outcome, Settlement, Transfer, TransferKind, outcome_of

Hand = TypeVar("Hand")
Config = TypeVar("Config")


class AreaBet(Protocol):
    """A bet on an area, as each game's ``Bet`` holds it."""

    @property
    def bet_id(self) -> str: ...
    @property
    def player(self) -> str: ...
    @property
    def area(self) -> str: ...
    @property
    def stake_minor(self) -> int: ...


@dataclass(frozen=True, slots=True)
class AgainstDealer(Generic[Hand, Config]):
    """What a dealer-against-areas game tells ``settle``; each function also gets the table's config.

    ``net_exact(area, dealer, stake, config)`` is the bettor's exact balance
    change. ``gross_win(area, dealer, stake, config)`` is what the dealer pays a
    won bet before commission (0 when the area did not win); ``None`` for a game
    without commission, whose won bets are paid their net.
    """

    areas: tuple[str, ...]  # the area hands come in this order
    counterparty: str  # the dealer as error messages name it: "dealer", "banker"
    evaluate: Callable[[Sequence[Card], Config], Hand]
    net_exact: Callable[[Hand, Hand, Fraction, Config], Fraction]
    hold_minor: Callable[[int, Config], int]
    gross_win: Callable[[Hand, Hand, Fraction, Config], Fraction] | None = None


def settle(
    game: AgainstDealer[Hand, Config],
    config: Config,
    dealer_cards: Sequence[Card],
    area_cards: Sequence[Sequence[Card]],
    bets: Iterable[AreaBet],
    dealer_party: str,
) -> Settlement:
    """Settle every bet of a round; ``area_cards`` in ``game.areas`` order, all cards distinct.

    Every bet is checked before any is settled; ``dealer_party`` is the party
    that pays the winners and collects the losses.
    """
    if len(area_cards) != len(game.areas):
        raise ValueError(f"expected {len(game.areas)} area hands, got {len(area_cards)}")
    check_distinct([*dealer_cards, *(card for hand in area_cards for card in hand)])
    dealer = game.evaluate(dealer_cards, config)
    hands = {area: game.evaluate(cards, config) for area, cards in zip(game.areas, area_cards, strict=True)}
    results, transfers, remainders = [], [], []
    for bet in _checked(game, bets, dealer_party):
        result, moves, remainder = _settle_bet(game, config, bet, hands[bet.area], dealer, dealer_party)
        results.append(result)
        transfers.extend(moves)
        if remainder:
            remainders.append((bet.bet_id, remainder.numerator, remainder.denominator))
    return Settlement(tuple(results), tuple(transfers), tuple(remainders)).check()


def area_outcomes(
    game: AgainstDealer[Hand, Config],
    config: Config,
    dealer_cards: Sequence[Card],
    area_cards: Sequence[Sequence[Card]],
) -> dict[str, Outcome]:
    """Each area's outcome: the sign of what a bet on it nets, ``settle``'s own rule (so a win the
    commission takes whole is a push); ``area_cards`` in ``game.areas`` order."""
    dealer = game.evaluate(dealer_cards, config)
    return {
        area: outcome_of(game.net_exact(game.evaluate(cards, config), dealer, Fraction(1), config))
        for area, cards in zip(game.areas, area_cards, strict=True)
    }


def _checked(game: AgainstDealer[Hand, Config], bets: Iterable[AreaBet], dealer_party: str) -> list[AreaBet]:
    checked, seen = [], set()
    for bet in bets:
        if bet.area not in game.areas:
            raise ValueError(f"bet {bet.bet_id}: unknown area {bet.area!r} (areas: {', '.join(game.areas)})")
        if type(bet.stake_minor) is not int or bet.stake_minor <= 0:
            raise ValueError(f"bet {bet.bet_id}: stake must be a positive integer of minor units")
        if bet.player == dealer_party:
            raise ValueError(f"bet {bet.bet_id}: the {game.counterparty} cannot bet against itself")
        if bet.bet_id in seen:
            raise ValueError(f"duplicate bet id {bet.bet_id}")
        seen.add(bet.bet_id)
        checked.append(bet)
    return checked


def _settle_bet(
    game: AgainstDealer[Hand, Config], config: Config, bet: AreaBet, area: Hand, dealer: Hand, dealer_party: str
) -> tuple[BetResult, list[Transfer], Fraction]:
    """One bet -> (result, transfers, fraction of a minor unit rounded toward the dealer)."""
    stake = Fraction(bet.stake_minor)
    exact = game.net_exact(area, dealer, stake, config)
    net = floor(exact)
    transfers = []
    if net < 0:
        transfers.append(Transfer(bet.player, dealer_party, -net, TransferKind.LOSS, bet.bet_id))
    else:
        gross = net if game.gross_win is None else floor(game.gross_win(area, dealer, stake, config))
        if gross > 0:
            transfers.append(Transfer(dealer_party, bet.player, gross, TransferKind.WIN, bet.bet_id))
        if gross > net:
            transfers.append(Transfer(bet.player, COMMISSION_REVENUE, gross - net, TransferKind.COMMISSION, bet.bet_id))
    hold = game.hold_minor(bet.stake_minor, config)
    # The outcome is by what the bettor nets, exactly as each game's ``area_outcomes`` announces it.
    result = BetResult(bet.bet_id, bet.player, bet.area, bet.stake_minor, hold, outcome_of(exact), net)
    return result, transfers, exact - net
