"""Hundred-player Bull with jokers 百變牛牛 (variant id ``baibian_bull``), docs/rules/baibian_bull.md.

One banker against four areas (Heaven, Earth, Mystic, Yellow) from a 54-card
deck whose two jokers are wild. Pure functions of cards, bets and a frozen
config, like ``golden_bull``:

- ``evaluate(cards, config)`` -> ``BaibianHand`` whose ``strength`` integer is
  the comparison rule: category (Bull n is its own category), then the highest
  card by rank with big joker > small joker > K > ... > A, then its suit
  (S > H > C > D). Because the jokers outrank every card, "a hand holding the
  big joker is the strongest of its category, the small joker second" is just
  the highest-card rule.
- ``settle(banker, areas, bets, config, banker_party=...)`` -> ``Settlement``:
  bet x the winner's multiplier, both ways.
- ``first_seat`` and ``deal``: the dealing rule as a pure function of deck order.

Jokers take the best assignment: evaluation tries every rank for each joker
(13 or 169 ways) and keeps the strongest category. That search runs once per
(rank multiset, joker count) when the lookup table is built, not per hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from functools import lru_cache
from itertools import combinations_with_replacement, product
from math import ceil

from bull.cards import BIG_JOKER_RANK, DECK_54, SMALL_JOKER_RANK, Card, CardError, check_distinct
from bull.money import Outcome, Settlement
from bull.rules import against_dealer
from bull.rules import config as cfg
from bull.rules._bull import BULL_BULL, NO_BULL, bull_points

VARIANT_ID = "baibian_bull"
HAND_SIZE = 5
SEATS = ("banker", "heaven", "earth", "mystic", "yellow")  # clockwise from the banker
AREAS = SEATS[1:]
SUIT_ORDER = "SHCD"  # fixed by the seed: 黑 > 紅 > 梅 > 方


class Category(StrEnum):
    """Categories, declared strongest first."""

    BOMB = "bomb"
    GOLD = "gold"
    SILVER = "silver"
    BULL_BULL = "bull_bull"
    BULL_9 = "bull_9"
    BULL_8 = "bull_8"
    BULL_7 = "bull_7"
    BULL_6 = "bull_6"
    BULL_5 = "bull_5"
    BULL_4 = "bull_4"
    BULL_3 = "bull_3"
    BULL_2 = "bull_2"
    BULL_1 = "bull_1"
    NO_BULL = "no_bull"


CATEGORIES: tuple[Category, ...] = tuple(Category)
DEFAULT_MULTIPLIERS: tuple[Fraction, ...] = tuple(Fraction(m) for m in (10, 10, 10, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 1))
LEVEL: dict[Category, int] = {c: len(CATEGORIES) - i for i, c in enumerate(CATEGORIES)}
_BY_LEVEL: dict[int, Category] = {level: c for c, level in LEVEL.items()}
MAX_MULTIPLIER = Fraction(1000)
_KEY_BITS = 6  # high card key: rank << 2 | suit strength, rank up to 15 (big joker)
_FOUR_BITS = 4  # above the key: the rank of a Bomb's four (only with bomb_order=rank_of_four), else 0
_LEVEL_SHIFT = _KEY_BITS + _FOUR_BITS


class BombOrder(StrEnum):
    """How two Bombs compare."""

    GENERAL = "general"  # the seed's general rule: highest card (jokers highest), then suit (default)
    RANK_OF_FOUR = "rank_of_four"  # the rank of the four first (QQQQ3 beats 2222K), as Golden Bull does


class DealValue(StrEnum):
    """The value of the drawn card that picks the first seat to be dealt."""

    POINTS = "points"  # the seed's 點數: A=1 .. 9, 10/J/Q/K = 10, jokers 10 (interpretation; default)
    RANK = "rank"  # A=1 .. K=13, small joker 14, big joker 15 (the engine's earlier reading)


@dataclass(frozen=True, slots=True)
class BaibianBullConfig:
    """Table settings: ``multipliers.<category>``, ``bomb_order`` and ``deal.card_value``."""

    multipliers: tuple[Fraction, ...] = DEFAULT_MULTIPLIERS
    bomb_order: BombOrder = BombOrder.GENERAL
    deal_value: DealValue = DealValue.POINTS

    def __post_init__(self) -> None:
        if len(self.multipliers) != len(CATEGORIES):
            raise cfg.ConfigError("multipliers", f"expected {len(CATEGORIES)} values in category order")
        for category, value in zip(CATEGORIES, self.multipliers, strict=True):
            if not isinstance(value, Fraction) or not 0 < value <= MAX_MULTIPLIER:
                raise cfg.ConfigError(f"multipliers.{category}", f"must be a positive Fraction <= 1000: {value!r}")

    def multiplier(self, category: Category) -> Fraction:
        return self.multipliers[CATEGORIES.index(category)]

    @property
    def max_multiplier(self) -> Fraction:
        return max(self.multipliers)

    @classmethod
    def from_settings(cls, settings: cfg.Settings) -> BaibianBullConfig:
        flat = cfg.check_keys(settings, CONFIG_KEYS)
        values = list(DEFAULT_MULTIPLIERS)
        for i, category in enumerate(CATEGORIES):
            key = f"multipliers.{category}"
            if key in flat:
                values[i] = cfg.as_fraction(key, flat[key], low=Fraction(0), high=MAX_MULTIPLIER)
                if values[i] <= 0:
                    raise cfg.ConfigError(key, "must be positive")
        bomb_order = BombOrder(cfg.as_choice("bomb_order", flat.get("bomb_order", BombOrder.GENERAL), BombOrder))
        deal_value = DealValue(
            cfg.as_choice("deal.card_value", flat.get("deal.card_value", DealValue.POINTS), DealValue)
        )
        return cls(tuple(values), bomb_order, deal_value)

    def to_settings(self) -> dict[str, str]:
        settings = {f"multipliers.{c}": str(self.multiplier(c)) for c in CATEGORIES}
        return settings | {"bomb_order": str(self.bomb_order), "deal.card_value": str(self.deal_value)}


CONFIG_KEYS: tuple[str, ...] = (*(f"multipliers.{c}" for c in CATEGORIES), "bomb_order", "deal.card_value")
DEFAULT_CONFIG = BaibianBullConfig()


# --------------------------------------------------------------------------- evaluation


def classify(ranks: Sequence[int], jokers: int) -> Category:
    """Best category of the plain ``ranks`` plus ``jokers`` wild cards.

    The special hands have closed forms: a joker joins the largest group of a
    rank (Bomb), becomes a J/Q/K (Gold), or, when the one plain non-face card is
    a 10, completes four faces (Silver; a joker standing for the 10 itself would
    make Gold instead). For points, every joker value 1..10 is tried.
    """
    most = max((ranks.count(rank) for rank in ranks), default=0)
    faces = sum(rank >= 11 for rank in ranks)
    if most + jokers >= 4:
        return Category.BOMB
    if faces + jokers == HAND_SIZE:
        return Category.GOLD
    if faces + jokers == HAND_SIZE - 1 and 10 in ranks:
        return Category.SILVER
    values = [min(rank, 10) for rank in ranks]
    points = max(bull_points([*values, *extra]) for extra in product(range(1, 11), repeat=jokers))
    if points == NO_BULL:
        return Category.NO_BULL
    return Category.BULL_BULL if points == BULL_BULL else Category(f"bull_{points}")


@lru_cache(maxsize=1)
def category_table() -> dict[tuple[tuple[int, ...], int], Category]:
    """(sorted plain ranks, joker count) -> category, for every hand a 54-card deck deals."""
    table = {}
    for jokers in range(3):
        for ranks in combinations_with_replacement(range(1, 14), HAND_SIZE - jokers):
            if max((ranks.count(r) for r in ranks), default=0) <= 4:
                table[ranks, jokers] = classify(ranks, jokers)
    return table


def card_key(card: Card) -> int:
    """rank << 2 | suit strength; the jokers (ranks 14, 15) outrank every card."""
    if card.suit is None:
        return card.rank << 2
    return card.rank << 2 | (3 - SUIT_ORDER.index(card.suit.name))


@dataclass(frozen=True, slots=True)
class BaibianHand:
    """An evaluated hand: larger ``strength`` is stronger; equal only for impossible deals."""

    cards: tuple[Card, ...]
    strength: int
    high_index: int

    @property
    def category(self) -> Category:
        return _BY_LEVEL[self.strength >> _LEVEL_SHIFT]

    @property
    def high_card(self) -> Card:
        return self.cards[self.high_index]

    @property
    def jokers(self) -> int:
        return sum(card.is_joker for card in self.cards)


_PACK_SHIFT = 9
# Per rank: 5 ** (rank - 1) << 9 | rank << 2. Adding the suit strength (3 - canonical
# suit index, since the canonical order S, H, C, D is also the strength order) gives
# a card's packed value; a hand's sum holds its rank multiset in base 5 above bit 9,
# and its maximum is the high card (as in golden_bull).
_RANK_PACK = tuple(5 ** (rank - 1) << _PACK_SHIFT | rank << 2 if rank else 0 for rank in range(BIG_JOKER_RANK + 1))


def four_rank(ranks: Sequence[int], jokers: int) -> int:
    """The highest rank (A=1 .. K=13) a Bomb can make four of with its jokers; 0 if none."""
    return max((rank for rank in set(ranks) if ranks.count(rank) + jokers >= 4), default=0)


@lru_cache(maxsize=1)
def _four_by_code() -> dict[int, int]:
    """Base-5 rank code -> the rank of a Bomb's four (0 for every other category)."""
    joker_sets: dict[int, list[tuple[int, ...]]] = {
        0: [()],
        1: [(SMALL_JOKER_RANK,), (BIG_JOKER_RANK,)],
        2: [(SMALL_JOKER_RANK, BIG_JOKER_RANK)],
    }
    table = {}
    for (ranks, jokers), category in category_table().items():
        four = four_rank(ranks, jokers) if category is Category.BOMB else 0
        for extra in joker_sets[jokers]:
            table[sum(_RANK_PACK[rank] for rank in (*ranks, *extra)) >> _PACK_SHIFT] = four
    return table


@lru_cache(maxsize=1)
def _level_by_code() -> dict[int, int]:
    """Base-5 rank code (jokers as ranks 14 and 15) -> category level, for every hand."""
    joker_sets: dict[int, list[tuple[int, ...]]] = {
        0: [()],
        1: [(SMALL_JOKER_RANK,), (BIG_JOKER_RANK,)],
        2: [(SMALL_JOKER_RANK, BIG_JOKER_RANK)],
    }
    table = {}
    for (ranks, jokers), category in category_table().items():
        for extra in joker_sets[jokers]:
            table[sum(_RANK_PACK[rank] for rank in (*ranks, *extra)) >> _PACK_SHIFT] = LEVEL[category]
    return table


def evaluate(cards: Iterable[Card], config: BaibianBullConfig | None = None) -> BaibianHand:
    """Evaluate five distinct cards of the 54-card deck (only ``bomb_order`` of the config matters)."""
    hand = tuple(cards)
    packed = [_RANK_PACK[card.rank] | (0 if card.suit is None else 3 - card.suit) for card in hand]
    if len(hand) != HAND_SIZE or len(set(packed)) != HAND_SIZE:
        check_distinct(hand)
        raise CardError(f"a hand is {HAND_SIZE} cards, not {len(hand)}")
    high = max(packed)
    code = sum(packed) >> _PACK_SHIFT
    level = _level_by_code()[code]
    four = _four_by_code()[code] if config is not None and config.bomb_order is BombOrder.RANK_OF_FOUR else 0
    return BaibianHand(hand, level << _LEVEL_SHIFT | four << _KEY_BITS | high & 0b111111, packed.index(high))


def compare(a: BaibianHand, b: BaibianHand) -> int:
    """1 if ``a`` wins, -1 if ``b`` wins, 0 if equal (two hands cannot be equal in one deal)."""
    return (a.strength > b.strength) - (a.strength < b.strength)


def explain(a: BaibianHand, b: BaibianHand) -> str:
    if a.category != b.category:
        return f"category {a.category} vs {b.category}"
    if a.strength >> _KEY_BITS != b.strength >> _KEY_BITS:
        return "rank of the four (bomb_order=rank_of_four)"
    if a.high_card.rank != b.high_card.rank:
        return f"highest card {a.high_card} vs {b.high_card} (big joker > small joker > K > ... > A)"
    if a.high_card != b.high_card:
        return f"highest card {a.high_card} vs {b.high_card} by suit (S > H > C > D)"
    return "equal: the same highest card (cannot happen within one deal); settled as a push"


# --------------------------------------------------------------------------- dealing


JOKER_DEAL_POINTS = 10  # interpretation: a joker "can be any 點數"; as the drawn card it counts the most, 10


def card_value(card: Card, config: BaibianBullConfig | None = None) -> int:
    """The drawn card's value for choosing the first seat.

    ``deal.card_value=points`` (default): the seed's 點數, A=1, 2..9 face value,
    10/J/Q/K = 10, either joker 10 (interpretation: the seed gives jokers no fixed
    點數). ``rank``: A=1 .. K=13, small joker 14, big joker 15.
    """
    if (config or DEFAULT_CONFIG).deal_value is DealValue.RANK:
        return card.rank
    return JOKER_DEAL_POINTS if card.is_joker else min(card.rank, 10)


def first_seat(drawn: Card, config: BaibianBullConfig | None = None) -> int:
    """Seat that receives the first card: (value - 1) mod 5, 0 = banker, 1..4 = Heaven..Yellow."""
    return (card_value(drawn, config) - 1) % len(SEATS)


@dataclass(frozen=True, slots=True)
class BaibianDeal:
    """A deal: ``hands[s]`` is seat s's hand in the order dealt; its last card is the hidden one."""

    burned: Card
    first_seat: int
    hands: tuple[tuple[Card, ...], ...]  # in SEATS order

    @property
    def hidden(self) -> tuple[Card, ...]:
        """Each seat's fifth card, face down until that seat's reveal."""
        return tuple(hand[-1] for hand in self.hands)


def deal(deck_order: Sequence[Card], config: BaibianBullConfig | None = None) -> BaibianDeal:
    """The round's hands from the shuffled 54-card deck, a pure function of its order.

    Convention: ``deck_order[0]`` is the drawn card; it is shown and burned.
    Then ``deck_order[1:26]`` go out one at a time, round-robin, starting at
    ``first_seat(deck_order[0])`` and going clockwise (banker, Heaven, Earth,
    Mystic, Yellow, banker, ...): card ``deck_order[1 + i]`` goes to seat
    ``(first + i) % 5``. Each hand keeps deal order, so its fifth card
    (``hand[4]``) is the last one that seat received: the hidden card.
    """
    if len(deck_order) != len(DECK_54) or set(deck_order) != set(DECK_54):
        raise CardError("deck order must be a permutation of the 54-card deck")
    first = first_seat(deck_order[0], config)
    seats: list[list[Card]] = [[] for _ in SEATS]
    for i, card in enumerate(deck_order[1 : 1 + HAND_SIZE * len(SEATS)]):
        seats[(first + i) % len(SEATS)].append(card)
    return BaibianDeal(deck_order[0], first, tuple(tuple(hand) for hand in seats))


# --------------------------------------------------------------------------- money


@dataclass(frozen=True, slots=True)
class Bet:
    bet_id: str
    player: str
    area: str  # one of AREAS
    stake_minor: int


def hold_minor(stake_minor: int, config: BaibianBullConfig | None = None) -> int:
    """A bet's worst case: stake x the highest multiplier (x10 by default), rounded up."""
    return ceil(stake_minor * (config or DEFAULT_CONFIG).max_multiplier)


def net_exact(area: BaibianHand, banker: BaibianHand, stake: Fraction, config: BaibianBullConfig) -> Fraction:
    """The bettor's exact balance change: + stake x area multiplier, or - stake x banker multiplier."""
    order = compare(area, banker)
    if order > 0:
        return stake * config.multiplier(area.category)
    if order < 0:
        return -stake * config.multiplier(banker.category)
    return Fraction(0)


def area_outcomes(
    banker_cards: Sequence[Card], area_cards: Sequence[Sequence[Card]], config: BaibianBullConfig | None = None
) -> dict[str, Outcome]:
    """Each area's outcome under ``config``: the sign of what a bet on it nets (``settle``'s own rule)."""
    return against_dealer.area_outcomes(AGAINST_DEALER, config or DEFAULT_CONFIG, banker_cards, area_cards)


AGAINST_DEALER: against_dealer.AgainstDealer[BaibianHand, BaibianBullConfig] = against_dealer.AgainstDealer(
    areas=AREAS,
    counterparty="banker",
    evaluate=evaluate,
    net_exact=net_exact,
    hold_minor=hold_minor,
)


def settle(
    banker_cards: Sequence[Card],
    area_cards: Sequence[Sequence[Card]],
    bets: Iterable[Bet],
    config: BaibianBullConfig | None = None,
    *,
    banker_party: str,
) -> Settlement:
    """Settle a round; ``area_cards`` in ``AREAS`` order, ``banker_party`` is the banker's player id.

    Amounts that do not divide exactly round toward the banker's side of the
    table's house rule (winnings down, losses up) with the remainder recorded.
    """
    config = config or DEFAULT_CONFIG
    return against_dealer.settle(AGAINST_DEALER, config, banker_cards, area_cards, bets, banker_party)
