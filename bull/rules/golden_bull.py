"""Golden Bull (variant id ``golden_bull``): Dealer vs three Areas, docs/rules/golden_bull.md.

Everything here is a pure function of cards, bets and a frozen config:

- ``evaluate(cards, config)`` -> ``GoldenBullHand`` with its category, bull
  points and a single integer ``strength``; comparing strengths *is* the rule
  (category, then bull points, then highest card by rank, then that card's
  suit), so hands sort, compare and vectorise (see ``bull/analysis/fast.py``) with one key.
- ``settle(dealer, areas, bets, config)`` -> ``money.Settlement``.
- ``hold_minor(stake, config)``: the reservation made when a bet is confirmed.

Hand evaluation goes through a table keyed by the sorted ranks (6,175 possible
multisets), built once per (enabled specials) and cached on the config, because
category and points depend only on ranks; the suit only matters for the high
card, which is one ``max`` over precomputed card keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from functools import lru_cache
from itertools import combinations_with_replacement
from math import ceil

from bull.cards import DECK_52, Card, CardError, check_distinct
from bull.money import (
    BPS_DENOMINATOR,
    HOUSE,
    Outcome,
    Settlement,
)
from bull.rules import against_dealer
from bull.rules import config as cfg
from bull.rules._bull import BULL_BULL, NO_BULL, bull_points

VARIANT_ID = "golden_bull"
HAND_SIZE = 5
AREAS = ("area_1", "area_2", "area_3")


class Category(StrEnum):
    """Hand categories, declared strongest first (``CATEGORIES`` keeps that order)."""

    FIVE_SMALL = "five_small"
    BOMB = "bomb"
    FIVE_FACE = "five_face"
    FOUR_FACE = "four_face"
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
SPECIALS: tuple[Category, ...] = CATEGORIES[:4]
DEFAULT_MULTIPLIERS: tuple[Fraction, ...] = tuple(Fraction(m) for m in (5, 4, 3, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1))
# A category's level in ``strength``: stronger categories get larger numbers.
LEVEL: dict[Category, int] = {c: len(CATEGORIES) - i for i, c in enumerate(CATEGORIES)}
_BY_LEVEL: dict[int, Category] = {level: c for c, level in LEVEL.items()}
MAX_MULTIPLIER = Fraction(1000)


class Mode(StrEnum):
    AUTHENTIC = "authentic"  # a loss costs stake x the dealer's multiplier
    STAKE_CAPPED = "stake_capped"  # a loss costs the stake exactly


class ExactTie(StrEnum):
    DEALER = "dealer"
    PUSH = "push"


class BombOrder(StrEnum):
    """How two Bombs compare before the seed's general rule (bull points, highest card, suit)."""

    RANK_OF_FOUR = "rank_of_four"  # 5555K loses to QQQQA (the usual convention; the default)
    GENERAL = "general"  # the seed's general rule alone: 5555K (Bull Bull) beats QQQQA (bull 1)


def points_category(points: int) -> Category:
    """The ordinary category for bull points (0 = no bull, 10 = bull bull)."""
    if points == NO_BULL:
        return Category.NO_BULL
    if points == BULL_BULL:
        return Category.BULL_BULL
    return Category(f"bull_{points}")


# --------------------------------------------------------------------------- config


@dataclass(frozen=True, slots=True)
class _Lookup:
    """Evaluation tables for one (enabled, suit order, suit tiebreak) combination.

    ``packed[suit * 13 + rank]`` is ``5 ** (rank - 1) << 9 | rank << 2 | suit
    strength`` for each card. Summing a hand's packed values gives the rank
    multiset in base 5 above bit 9 (counts are at most 4, and the low parts add
    up to less than 512), so one integer addition replaces sorting the ranks;
    the largest packed value is the high card, ordered by rank then suit.
    """

    by_multiset: Mapping[int, tuple[Category, int, int]]  # base-5 rank counts -> (category, points, base)
    packed: Sequence[int]
    high_mask: int  # keeps the suit bits of the high card only when suit tiebreak is on
    ranks_by_multiset: Mapping[int, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class GoldenBullConfig:
    """Admin settings for one table. Build from settings with ``from_settings``.

    ``multipliers`` follows ``CATEGORIES`` order; ``enabled`` is the set of
    enabled special categories; ``suit_order`` lists suits strongest first.
    """

    mode: Mode = Mode.AUTHENTIC
    multipliers: tuple[Fraction, ...] = DEFAULT_MULTIPLIERS
    enabled: frozenset[Category] = frozenset(SPECIALS)
    suit_order: str = "SHCD"
    suit_tiebreak: bool = True
    exact_tie: ExactTie = ExactTie.DEALER
    commission_bps: int = 0
    bomb_order: BombOrder = BombOrder.RANK_OF_FOUR
    _lookup: _Lookup = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        _validate(self)
        lookup = _build_lookup(self.enabled, self.suit_order, self.suit_tiebreak, self.bomb_order)
        object.__setattr__(self, "_lookup", lookup)

    def multiplier(self, category: Category) -> Fraction:
        return self.multipliers[CATEGORIES.index(category)]

    def is_enabled(self, category: Category) -> bool:
        return category not in SPECIALS or category in self.enabled

    @property
    def max_multiplier(self) -> Fraction:
        """The highest multiplier a hand can actually pay (disabled specials cannot occur)."""
        return max(self.multiplier(c) for c in CATEGORIES if self.is_enabled(c))

    @property
    def symmetric(self) -> bool:
        """True when swapping dealer and area hands exactly negates every bet's result."""
        exact_ties_impossible = self.suit_tiebreak or self.exact_tie is ExactTie.PUSH
        integral = all(m.denominator == 1 for m in self.multipliers)
        return self.mode is Mode.AUTHENTIC and self.commission_bps == 0 and exact_ties_impossible and integral

    @classmethod
    def from_settings(cls, settings: cfg.Settings) -> GoldenBullConfig:
        """Defaults overridden by ``settings`` (flat dotted keys or nested tables)."""
        flat = cfg.check_keys(settings, CONFIG_KEYS)
        multipliers = list(DEFAULT_MULTIPLIERS)
        enabled = set(SPECIALS)
        for i, category in enumerate(CATEGORIES):
            key = f"multipliers.{category}"
            if key in flat:
                multipliers[i] = _multiplier(key, flat[key])
        for category in SPECIALS:
            key = f"enabled.{category}"
            if key in flat and not cfg.as_bool(key, flat[key]):
                enabled.discard(category)
        return cls(
            mode=Mode(cfg.as_choice("mode", flat.get("mode", "authentic"), Mode)),
            multipliers=tuple(multipliers),
            enabled=frozenset(enabled),
            suit_order=_suit_order(flat.get("suit_order", "SHCD")),
            suit_tiebreak=cfg.as_bool("suit_tiebreak", flat.get("suit_tiebreak", True)),
            exact_tie=ExactTie(cfg.as_choice("exact_tie", flat.get("exact_tie", "dealer"), ExactTie)),
            commission_bps=cfg.as_int("commission_bps", flat.get("commission_bps", 0), low=0, high=BPS_DENOMINATOR),
            bomb_order=BombOrder(cfg.as_choice("bomb_order", flat.get("bomb_order", "rank_of_four"), BombOrder)),
        )

    def to_settings(self) -> dict[str, str]:
        """Every key with its value as text: ``from_settings(c.to_settings()) == c``."""
        settings = {
            "mode": str(self.mode),
            "suit_order": self.suit_order,
            "suit_tiebreak": str(self.suit_tiebreak).lower(),
            "exact_tie": str(self.exact_tie),
            "commission_bps": str(self.commission_bps),
            "bomb_order": str(self.bomb_order),
        }
        settings |= {f"multipliers.{c}": str(self.multiplier(c)) for c in CATEGORIES}
        settings |= {f"enabled.{c}": str(c in self.enabled).lower() for c in SPECIALS}
        return settings


CONFIG_KEYS: tuple[str, ...] = (
    "mode",
    *(f"multipliers.{c}" for c in CATEGORIES),
    *(f"enabled.{c}" for c in SPECIALS),
    "suit_order",
    "suit_tiebreak",
    "exact_tie",
    "commission_bps",
    "bomb_order",
)


def _multiplier(key: str, value: object) -> Fraction:
    number = cfg.as_fraction(key, value, low=Fraction(0), high=MAX_MULTIPLIER)
    if number <= 0:
        raise cfg.ConfigError(key, "must be positive")
    return number


def _suit_order(value: object) -> str:
    if isinstance(value, str) and sorted(value.strip().upper()) == sorted("SHCD"):
        return value.strip().upper()
    raise cfg.ConfigError("suit_order", f"expected the four suits S, H, C, D strongest first, not {value!r}")


def _validate(config: GoldenBullConfig) -> None:
    """Direct construction gets the same checks (and key names) as ``from_settings``."""
    if len(config.multipliers) != len(CATEGORIES):
        raise cfg.ConfigError("multipliers", f"expected {len(CATEGORIES)} values in category order")
    for category, value in zip(CATEGORIES, config.multipliers, strict=True):
        if not isinstance(value, Fraction) or not 0 < value <= MAX_MULTIPLIER:
            raise cfg.ConfigError(f"multipliers.{category}", f"must be a positive Fraction <= 1000, not {value!r}")
    if not config.enabled <= set(SPECIALS):
        raise cfg.ConfigError("enabled", "only special categories can be enabled or disabled")
    _suit_order(config.suit_order)
    if type(config.commission_bps) is not int or not 0 <= config.commission_bps <= BPS_DENOMINATOR:
        raise cfg.ConfigError("commission_bps", f"must be an integer 0..10000, not {config.commission_bps!r}")


# --------------------------------------------------------------------------- evaluation


def classify(ranks: Sequence[int], enabled: frozenset[Category] = frozenset(SPECIALS)) -> tuple[Category, int, int]:
    """(category, bull points, rank of the four or 0) for five ranks, 1 (ace) .. 13 (king).

    Checks run strongest first, so a hand meeting two definitions takes the
    stronger one (AAAA2 is Five Small); a disabled special falls through.
    """
    values = [min(rank, 10) for rank in ranks]
    points = bull_points(values)
    four = next((rank for rank in set(ranks) if ranks.count(rank) == 4), 0)
    faces = sum(rank >= 11 for rank in ranks)
    tests = (
        (Category.FIVE_SMALL, max(values) <= 4 and sum(values) <= 10),
        (Category.BOMB, four > 0),
        (Category.FIVE_FACE, faces == 5),
        (Category.FOUR_FACE, faces == 4 and 10 in ranks),
    )
    for category, applies in tests:
        if applies and category in enabled:
            return category, points, four if category is Category.BOMB else 0
    return points_category(points), points, 0


def base_strength(category: Category, points: int, four: int) -> int:
    """The rank-multiset part of ``strength``; the high card fills the low 6 bits.

    Layout: category level << 14 | rank of a bomb's four << 10 | points << 6 |
    high rank << 2 | high suit strength, so integer order is the comparison rule.
    """
    return LEVEL[category] << 14 | four << 10 | points << 6


def rank_multisets() -> Iterable[tuple[int, ...]]:
    """Every sorted 5-rank multiset a 52-card deck can deal (6,175 of them)."""
    for ranks in combinations_with_replacement(range(1, 14), HAND_SIZE):
        if max(ranks.count(r) for r in ranks) <= 4:
            yield ranks


_PACK_SHIFT = 9


def multiset_code(ranks: Iterable[int]) -> int:
    """A rank multiset as one integer: base-5 digit ``rank - 1`` counts that rank."""
    return sum(5 ** (rank - 1) for rank in ranks)


def _build_lookup(
    enabled: frozenset[Category], suit_order: str, suit_tiebreak: bool, bomb_order: BombOrder = BombOrder.RANK_OF_FOUR
) -> _Lookup:
    by_multiset, ranks_by_multiset = _rank_tables(enabled, bomb_order)
    return _Lookup(by_multiset, _packed_cards(suit_order), 0b111111 if suit_tiebreak else 0b111100, ranks_by_multiset)


@lru_cache(maxsize=32)  # one per subset of the four specials and bomb order
def _rank_tables(
    enabled: frozenset[Category], bomb_order: BombOrder = BombOrder.RANK_OF_FOUR
) -> tuple[dict[int, tuple[Category, int, int]], dict[int, tuple[int, ...]]]:
    by_multiset, ranks_by_multiset = {}, {}
    for ranks in rank_multisets():
        category, points, four = classify(ranks, enabled)
        four = four if bomb_order is BombOrder.RANK_OF_FOUR else 0
        code = multiset_code(ranks)
        by_multiset[code] = (category, points, base_strength(category, points, four))
        ranks_by_multiset[code] = ranks
    return by_multiset, ranks_by_multiset


@lru_cache(maxsize=24)  # one per suit order
def _packed_cards(suit_order: str) -> tuple[int, ...]:
    packed = [0] * (4 * 13 + 14)
    for card in DECK_52:
        assert card.suit is not None
        key = card.rank << 2 | suit_strength(card, suit_order)
        packed[card.suit * 13 + card.rank] = multiset_code([card.rank]) << _PACK_SHIFT | key
    return tuple(packed)


def suit_strength(card: Card, suit_order: str) -> int:
    """3 for the strongest suit in ``suit_order`` .. 0 for the weakest."""
    assert card.suit is not None, "jokers have no suit"
    return 3 - suit_order.index(card.suit.name)


@dataclass(frozen=True, slots=True)
class GoldenBullHand:
    """An evaluated hand. ``strength`` orders hands: larger is stronger, equal is an exact tie.

    Only three fields, because building a frozen dataclass costs per field and
    evaluation must stay within a few microseconds; category, points and the
    high card are read back from ``strength`` and ``high_index``.
    """

    cards: tuple[Card, ...]
    strength: int
    high_index: int

    @property
    def category(self) -> Category:
        return _BY_LEVEL[self.strength >> 14]

    @property
    def points(self) -> int:
        """The bull value the cards make (0 no bull, 1..9, 10 Bull Bull), even for a special."""
        return self.strength >> 6 & 0b1111

    @property
    def high_card(self) -> Card:
        return self.cards[self.high_index]


def evaluate(cards: Iterable[Card], config: GoldenBullConfig | None = None) -> GoldenBullHand:
    """Evaluate five distinct non-joker cards under ``config`` (default config if None)."""
    lookup = (config or DEFAULT_CONFIG)._lookup
    hand = tuple(cards)
    try:
        packed = [lookup.packed[card.suit * 13 + card.rank] for card in hand]  # type: ignore[operator]
    except TypeError:
        raise CardError("golden_bull uses a 52-card deck: jokers are not allowed") from None
    if len(hand) != HAND_SIZE or len(set(packed)) != HAND_SIZE:
        check_distinct(hand)
        raise CardError(f"a hand is {HAND_SIZE} cards, not {len(hand)}")
    high = max(packed)
    _category, _points, base = lookup.by_multiset[sum(packed) >> _PACK_SHIFT]
    return GoldenBullHand(hand, base | high & lookup.high_mask, packed.index(high))


def compare(a: GoldenBullHand, b: GoldenBullHand) -> int:
    """1 if ``a`` beats ``b``, -1 if ``b`` beats ``a``, 0 for an exact tie."""
    return (a.strength > b.strength) - (a.strength < b.strength)


def explain(a: GoldenBullHand, b: GoldenBullHand, config: GoldenBullConfig | None = None) -> str:
    """Which comparison key decided, in words (for the CLI and logs)."""
    config = config or DEFAULT_CONFIG
    if a.category != b.category:
        return f"category {a.category} vs {b.category}"
    if a.category is Category.BOMB and a.strength >> 10 != b.strength >> 10:
        return "rank of the four"
    if a.points != b.points:
        return f"bull points {a.points} vs {b.points}"
    if a.high_card.rank != b.high_card.rank:
        return f"highest card {a.high_card} vs {b.high_card} by rank"
    if config.suit_tiebreak and a.high_card != b.high_card:
        return f"highest card {a.high_card} vs {b.high_card} by suit (order {config.suit_order})"
    return f"exact tie, settled by exact_tie={config.exact_tie}"


DEFAULT_CONFIG = GoldenBullConfig()


# --------------------------------------------------------------------------- money


@dataclass(frozen=True, slots=True)
class Bet:
    bet_id: str
    player: str
    area: str
    stake_minor: int


def hold_minor(stake_minor: int, config: GoldenBullConfig | None = None) -> int:
    """Worst-case loss of a bet, reserved when it is confirmed (rounded toward the house)."""
    config = config or DEFAULT_CONFIG
    if config.mode is Mode.STAKE_CAPPED:
        return stake_minor
    return ceil(stake_minor * config.max_multiplier)


def outcome(area: GoldenBullHand, dealer: GoldenBullHand, config: GoldenBullConfig | None = None) -> Outcome:
    """Win, loss or push for a bet on ``area`` (exact ties follow ``exact_tie``)."""
    config = config or DEFAULT_CONFIG
    order = compare(area, dealer)
    if order > 0:
        return Outcome.WIN
    if order < 0 or config.exact_tie is ExactTie.DEALER:
        return Outcome.LOSS
    return Outcome.PUSH


def net_exact(area: GoldenBullHand, dealer: GoldenBullHand, stake: Fraction, config: GoldenBullConfig) -> Fraction:
    """The bettor's exact (unrounded) balance change: what rounding is measured against."""
    result = outcome(area, dealer, config)
    if result is Outcome.WIN:
        return stake * config.multiplier(area.category) * (BPS_DENOMINATOR - config.commission_bps) / BPS_DENOMINATOR
    if result is Outcome.LOSS:
        return -stake if config.mode is Mode.STAKE_CAPPED else -stake * config.multiplier(dealer.category)
    return Fraction(0)


def area_outcomes(
    dealer_cards: Sequence[Card], area_cards: Sequence[Sequence[Card]], config: GoldenBullConfig | None = None
) -> dict[str, Outcome]:
    """Each area's outcome: the sign of what a bet on it nets (a win the commission takes whole is a push)."""
    return against_dealer.area_outcomes(AGAINST_DEALER, config or DEFAULT_CONFIG, dealer_cards, area_cards)


def _gross_win(area: GoldenBullHand, dealer: GoldenBullHand, stake: Fraction, config: GoldenBullConfig) -> Fraction:
    """What the dealer pays a winning bet before commission: stake x the area's multiplier."""
    return stake * config.multiplier(area.category) if outcome(area, dealer, config) is Outcome.WIN else Fraction(0)


AGAINST_DEALER: against_dealer.AgainstDealer[GoldenBullHand, GoldenBullConfig] = against_dealer.AgainstDealer(
    areas=AREAS,
    counterparty="dealer",
    evaluate=evaluate,
    net_exact=net_exact,
    hold_minor=hold_minor,
    gross_win=_gross_win,
)


def settle(
    dealer_cards: Sequence[Card],
    area_cards: Sequence[Sequence[Card]],
    bets: Iterable[Bet],
    config: GoldenBullConfig | None = None,
    *,
    dealer_party: str = HOUSE,
) -> Settlement:
    """Settle every bet of a round; the three area hands are in ``AREAS`` order.

    The 20 cards must be distinct (one deck). Winnings the dealer pays are
    rounded down and losses rounded up (toward the house); commission is what
    separates the rounded gross win from the rounded net. Each fraction of a
    minor unit that rounding moved is recorded in ``remainders``.
    """
    config = config or DEFAULT_CONFIG
    return against_dealer.settle(AGAINST_DEALER, config, dealer_cards, area_cards, bets, dealer_party)


# --------------------------------------------------------------------------- deal


@dataclass(frozen=True, slots=True)
class GoldenBullDeal:
    dealer: tuple[Card, ...]
    areas: tuple[tuple[Card, ...], ...]  # in AREAS order


def deal(deck_order: Sequence[Card]) -> GoldenBullDeal:
    """The round's hands from the shuffled 52-card deck: a pure function of deck order.

    Convention: the dealer gets deck[0:5], Area 1 deck[5:10], Area 2 deck[10:15],
    Area 3 deck[15:20]; the other 32 cards are unused. Blocks rather than
    round-robin because the shuffle is uniform, so both give the same odds and
    blocks are easier to verify by hand.
    """
    if len(deck_order) != len(DECK_52) or set(deck_order) != set(DECK_52):
        raise CardError("deck order must be a permutation of the 52-card deck")
    hands = [tuple(deck_order[i : i + HAND_SIZE]) for i in range(0, 4 * HAND_SIZE, HAND_SIZE)]
    return GoldenBullDeal(dealer=hands[0], areas=tuple(hands[1:]))
