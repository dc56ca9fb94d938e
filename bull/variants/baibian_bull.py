"""百變牛牛 (``baibian_bull``): a player banks against Heaven, Earth, Mystic and Yellow.

- 54-card deck; ``deal`` is the rules' deal convention: deck position 0 is the
  drawn card (shown, burned; its value picks the first seat), then 25 cards go
  round-robin clockwise from that seat (``deal_facts`` gives the drawn card and
  the first seat for the public ``Dealt`` event; ``dealt_prefix`` inverts the deal).
- Reveals come in two passes: ``face_up`` shows every hand's first four cards
  (Heaven, Earth, Mystic, Yellow, banker), then ``open`` shows each hand whole,
  its fifth card included, in the same order, the banker last.
- ``settle`` is against the banking player named in ``Funding.dealer``, who pays
  from the banker's hold (``Funding.dealer_hold_id``): the table cap (banker
  capital / 10) keeps every round's payments within it.

Table settings besides the rules' ``multipliers.<category>``: ``base_score``
(wallet minor units per chip point: chips are 100 ... 10 000 000 points),
``banker.min_capital_minor`` (a banker's capital below it ends the tenure) and
``banker.session_rounds`` (a tenure's length, 72 rounds: 一局).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

from bull.cards import Card, parse_card
from bull.money import Settlement
from bull.rules import baibian_bull as bb
from bull.rules import config as cfg
from bull.variants.base import (
    CardGame,
    DealInput,
    Funding,
    NoSideBets,
    RoundShape,
    SeatHand,
    TableBet,
    Variant,
    deck_of,
    fund_bets,
)

BANKER_SEAT = "banker"
# The rules' name for the banker's side of a transfer when no banking player is named (no bets).
BANKER_PARTY = "banker"
FACE_UP = "face_up"
OPEN = "open"
FACE_UP_CARDS = bb.HAND_SIZE - 1
CHIP_POINTS: tuple[int, ...] = (100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000)

BASE_SCORE = "base_score"
MIN_CAPITAL = "banker.min_capital_minor"
SESSION_ROUNDS = "banker.session_rounds"
TABLE_KEYS = (BASE_SCORE, MIN_CAPITAL, SESSION_ROUNDS)
DEFAULT_BASE_SCORE = 1
DEFAULT_MIN_CAPITAL_MINOR = 1_000_000
DEFAULT_SESSION_ROUNDS = 72
MAX_BASE_SCORE = 10**6
MAX_CAPITAL_MINOR = 10**15


class NoBanker(ValueError):
    """Bets to settle with nobody banking the round: the table refuses such bets, so this is a bug."""


@dataclass(frozen=True, slots=True)
class BaibianTableConfig:
    rules: bb.BaibianBullConfig = field(default_factory=bb.BaibianBullConfig)
    base_score: int = DEFAULT_BASE_SCORE
    min_capital_minor: int = DEFAULT_MIN_CAPITAL_MINOR
    session_rounds: int = DEFAULT_SESSION_ROUNDS

    @property
    def chips_minor(self) -> tuple[int, ...]:
        return tuple(points * self.base_score for points in CHIP_POINTS)

    @property
    def min_chip_minor(self) -> int:
        return self.chips_minor[0]

    @property
    def max_multiplier(self) -> Fraction:
        return self.rules.max_multiplier

    def cap_minor(self, capital_minor: int) -> int:
        """One tenth (1 / the highest multiplier) of a capital: the most it can stake, or cover."""
        top = self.max_multiplier
        return capital_minor * top.denominator // top.numerator

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> BaibianTableConfig:
        flat = dict(settings)
        base = cfg.as_int(BASE_SCORE, flat.pop(BASE_SCORE, DEFAULT_BASE_SCORE), low=1, high=MAX_BASE_SCORE)
        minimum = cfg.as_int(
            MIN_CAPITAL, flat.pop(MIN_CAPITAL, DEFAULT_MIN_CAPITAL_MINOR), low=1, high=MAX_CAPITAL_MINOR
        )
        rounds = cfg.as_int(SESSION_ROUNDS, flat.pop(SESSION_ROUNDS, DEFAULT_SESSION_ROUNDS), low=1, high=10_000)
        return cls(bb.BaibianBullConfig.from_settings(flat), base, minimum, rounds)

    def to_settings(self) -> dict[str, str]:
        return self.rules.to_settings() | {
            BASE_SCORE: str(self.base_score),
            MIN_CAPITAL: str(self.min_capital_minor),
            SESSION_ROUNDS: str(self.session_rounds),
        }


def bull_points(category: bb.Category) -> int:
    """10 for Bull Bull and the special hands above it, n for Bull n, 0 for No Bull."""
    if category is bb.Category.NO_BULL:
        return 0
    if category.startswith("bull_") and category is not bb.Category.BULL_BULL:
        return int(category.removeprefix("bull_"))
    return 10


class BaibianBull(CardGame[BaibianTableConfig], NoSideBets[BaibianTableConfig]):
    """One banker against Heaven, Earth, Mystic and Yellow (see the module docstring)."""

    variant_id = bb.VARIANT_ID
    shape = RoundShape.BANKER_SEAT
    deck_size = 54
    cards_dealt = 1 + bb.HAND_SIZE * len(bb.SEATS)  # the burned card, then five per seat
    areas: tuple[str, ...] = bb.AREAS
    reveal_order: tuple[str, ...] = (*bb.AREAS, BANKER_SEAT)
    reveal_groups: tuple[str, ...] = (FACE_UP, OPEN)

    def parse_config(self, settings: Mapping[str, str]) -> BaibianTableConfig:
        return BaibianTableConfig.from_settings(settings)

    def config_settings(self, config: BaibianTableConfig) -> dict[str, str]:
        return config.to_settings()

    def hold_minor(self, stake_minor: int, config: BaibianTableConfig) -> int:
        return bb.hold_minor(stake_minor, config.rules)

    def hold_multiplier(self, config: BaibianTableConfig) -> Fraction:
        return config.max_multiplier

    def deal(self, drawn: DealInput, config: BaibianTableConfig) -> dict[str, SeatHand]:
        dealt = bb.deal(deck_of(drawn), config.rules)
        hands = {}
        for seat, cards in zip(bb.SEATS, dealt.hands, strict=True):
            category = bb.evaluate(cards, config.rules).category
            hands[seat] = SeatHand(seat, cards, str(category), bull_points(category), config.rules.multiplier(category))
        return hands

    def reveal_part(self, hand: SeatHand, group: str, config: BaibianTableConfig) -> SeatHand:
        assert group in self.reveal_groups, group
        if group == FACE_UP:  # the fifth card stays face down
            return SeatHand(hand.seat, hand.cards[:FACE_UP_CARDS], "", 0, Fraction(0))
        return hand

    def settle(
        self,
        hands: Mapping[str, SeatHand],
        bets: Sequence[TableBet],
        config: BaibianTableConfig,
        funding: Funding,
    ) -> Settlement:
        if bets and not funding.dealer:
            raise NoBanker(f"{len(bets)} bets and nobody banks the round")
        if any(b.player == funding.dealer for b in bets):
            raise NoBanker("the banker bet against their own seat")
        banker = funding.dealer or BANKER_PARTY
        settlement = fund_bets(
            bb.settle(
                hands[BANKER_SEAT].cards,
                [hands[area].cards for area in bb.AREAS],
                [bb.Bet(b.bet_id, b.player, b.area, b.stake_minor) for b in bets],
                config.rules,
                banker_party=banker,
            ),
            bets,
        )
        # The table cap (capital / 10 against at most stake x 10) keeps the banker's payments within the hold.
        transfers = tuple(
            replace(t, hold_id=funding.dealer_hold_id) if t.payer == banker else t for t in settlement.transfers
        )
        return replace(settlement, transfers=transfers)

    def area_outcomes(
        self, hands: Mapping[str, SeatHand], config: BaibianTableConfig, settlement: Settlement | None = None
    ) -> dict[str, str]:
        cards = [hands[area].cards for area in bb.AREAS]
        return {area: str(o) for area, o in bb.area_outcomes(hands[BANKER_SEAT].cards, cards, config.rules).items()}


def deal_facts(deck: Sequence[Card], config: BaibianTableConfig) -> tuple[str, str]:
    """The public facts of a deal: (the drawn, burned card; the seat it picks to deal first)."""
    drawn = deck[0]
    return drawn.code, bb.SEATS[bb.first_seat(drawn, config.rules)]


def dealt_prefix(
    drawn_card: str, hands: Mapping[str, Sequence[str]], config: BaibianTableConfig | None = None
) -> list[str]:
    """The deck's dealt prefix from the drawn card and each seat's hand in deal order (for verifiers).

    Inverse of ``rules.baibian_bull.deal``: deck position 1 + i went to seat
    ``(first + i) % 5`` as that seat's card number ``i // 5``.
    """
    first = bb.first_seat(parse_card(drawn_card), (config or BaibianTableConfig()).rules)
    prefix = [drawn_card]
    for i in range(bb.HAND_SIZE * len(bb.SEATS)):
        prefix.append(hands[bb.SEATS[(first + i) % len(bb.SEATS)]][i // len(bb.SEATS)])
    return prefix


BAIBIAN_BULL: Variant[BaibianTableConfig] = BaibianBull()
