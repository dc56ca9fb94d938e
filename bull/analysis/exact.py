"""Exact Golden Bull odds for one area against the dealer, every deal counted.

There are C(52,5) * C(47,5) ~ 4.0e12 ordered (area, dealer) pairs of disjoint
hands, far too many to enumerate, but a hand's strength depends only on its
rank multiset (6,175 of them) and its high card, so we count at that level:

* Given the area hand A (multiset alpha), the dealer draws from 47 cards with
  ``a_r = 4 - n_r(alpha)`` cards left of each rank, so the number of dealer
  hands with multiset beta is ``F(alpha, beta) = prod_r C(a_r, m_r(beta))``.
  Sorting multisets by *class* (strength without the high card's suit) and
  taking cumulative sums of F gives, for every alpha, how many dealer hands
  are below, level with and above it, and how many fall in each category.
* Within the same class the high rank h is shared and the suit decides. Say
  A's high card has p weaker suits (p = 0..3). A's other n_h - 1 cards of rank
  h all sit in those p suits, so ``w = p - (n_h - 1)`` weaker suits of rank h
  are left for the dealer, and the dealer hands of multiset beta that lose on
  suit number ``C(w, m_h) * prod_{r != h} C(a_r, m_r)``. The number of area
  hands with (alpha, p) is ``C(p, n_h - 1) * prod_{r != h} C(4, n_r)``.

All sums are exact integers (int64 never overflows: totals stay below 4.0e12),
and money follows in Fractions, so the RTP is exact. ``tests/rules`` checks
single hands against a brute force over all 1,533,939 dealer hands.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from math import comb

import numpy as np
import numpy.typing as npt

from bull.cards import Card
from bull.money import BPS_DENOMINATOR
from bull.rules.golden_bull import (
    CATEGORIES,
    DEFAULT_CONFIG,
    LEVEL,
    BombOrder,
    Category,
    ExactTie,
    GoldenBullConfig,
    Mode,
    evaluate,
    multiset_code,
)

IntArray = npt.NDArray[np.int64]

HANDS = comb(52, 5)
DEALER_HANDS = comb(47, 5)
PAIRS = HANDS * DEALER_HANDS
_LEVELS = len(CATEGORIES) + 1
_PAD_RANK = 13  # a 14th "rank" with 4 cards left and multiplicity 0: C(4, 0) = 1
_BINOM = np.array([comb(a, m) for a in range(5) for m in range(5)], dtype=np.int64)  # index a * 5 + m
_BLOCK = 128


@dataclass(frozen=True, slots=True)
class _Multisets:
    """Every rank multiset, sorted by class; ranks are 0-based (ace = 0) here."""

    codes: dict[int, int]  # multiset_code -> position
    cls: IntArray
    level: IntArray
    counts: IntArray  # (M, 13) cards of each rank
    ranks: IntArray  # (M, 5) distinct ranks, padded with _PAD_RANK
    mult: IntArray  # (M, 5) their multiplicities, padded with 0
    high: IntArray  # (M,) highest rank


@dataclass(frozen=True, slots=True)
class _Counts:
    """Per multiset alpha: dealer hands below / level with / above, by category, and on suit."""

    sets: _Multisets
    below: IntArray  # dealer hands of a lower class
    same: IntArray  # dealer hands of the same class
    by_level: IntArray  # (M, levels) dealer hands per category level
    suit_wins: IntArray  # (M, 4) same-class dealer hands beaten on suit, by p
    area_hands: IntArray  # (M, 4) area hands with this multiset and high-suit position p


def _multisets(config: GoldenBullConfig) -> _Multisets:
    lookup = config._lookup
    rows = sorted(
        (base | max(lookup.ranks_by_multiset[code]) << 2, code)
        for code, (_category, _points, base) in lookup.by_multiset.items()
    )
    size = len(rows)
    counts = np.zeros((size, 13), dtype=np.int64)
    ranks = np.full((size, 5), _PAD_RANK, dtype=np.int64)
    mult = np.zeros((size, 5), dtype=np.int64)
    for i, (_cls, code) in enumerate(rows):
        for rank in lookup.ranks_by_multiset[code]:
            counts[i, rank - 1] += 1
        present = np.flatnonzero(counts[i])
        ranks[i, : len(present)] = present
        mult[i, : len(present)] = counts[i, present]
    cls = np.array([c for c, _ in rows], dtype=np.int64)
    high = np.array([max(lookup.ranks_by_multiset[code]) - 1 for _, code in rows], dtype=np.int64)
    return _Multisets({code: i for i, (_, code) in enumerate(rows)}, cls, cls >> 14, counts, ranks, mult, high)


@lru_cache(maxsize=32)
def _counts(enabled: frozenset[Category], bomb_order: BombOrder = BombOrder.RANK_OF_FOUR) -> _Counts:
    sets = _multisets(GoldenBullConfig(enabled=enabled, bomb_order=bomb_order))
    size = len(sets.cls)
    lo = np.searchsorted(sets.cls, sets.cls, side="left")
    hi = np.searchsorted(sets.cls, sets.cls, side="right")
    level_start = np.searchsorted(sets.level, np.arange(_LEVELS + 1), side="left")
    avail = np.concatenate([4 - sets.counts, np.full((size, 1), 4, dtype=np.int64)], axis=1)
    below, same = np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64)
    by_level = np.empty((size, _LEVELS), dtype=np.int64)
    for start in range(0, size, _BLOCK):
        rows = slice(start, min(start + _BLOCK, size))
        cum = _cumulative_dealer_hands(avail[rows], sets)
        index = np.arange(rows.stop - rows.start)
        below[rows] = cum[index, lo[rows]]
        same[rows] = cum[index, hi[rows]] - below[rows]
        by_level[rows] = cum[:, level_start[1:]] - cum[:, level_start[:-1]]
    return _Counts(sets, below, same, by_level, _suit_wins(sets, avail, lo, hi), _area_hands(sets))


def _cumulative_dealer_hands(avail: IntArray, sets: _Multisets) -> IntArray:
    """(rows, M + 1): cum[i, k] = dealer hands, given area row i, among the first k multisets.

    Each area row gets its own little table ``choose[rank * 5 + m] = C(a_rank, m)``
    so that each of the five factors is a single gather.
    """
    choose = _BINOM.astype(np.int32).reshape(5, 5)[avail].reshape(len(avail), -1)
    slot = sets.ranks * 5 + sets.mult
    hands = choose[:, slot[:, 0]]
    for j in range(1, 5):
        hands *= choose[:, slot[:, j]]
    cum = np.zeros((len(avail), len(sets.cls) + 1), dtype=np.int64)
    np.cumsum(hands, axis=1, out=cum[:, 1:])
    return cum


def _suit_wins(sets: _Multisets, avail: IntArray, lo: IntArray, hi: IntArray) -> IntArray:
    """(M, 4): same-class dealer hands whose high suit is weaker than the area's, by p."""
    sizes = hi - lo
    alpha = np.repeat(np.arange(len(sets.cls)), sizes)
    beta = lo[alpha] + (np.arange(len(alpha)) - np.repeat(np.cumsum(sizes) - sizes, sizes))
    h = sets.high[alpha]
    rest = np.ones(len(alpha), dtype=np.int64)
    for j in range(5):
        rank = sets.ranks[beta, j]
        factor = _BINOM[avail[alpha, rank] * 5 + sets.mult[beta, j]]
        rest *= np.where(rank == h, 1, factor)
    dealer_high = sets.counts[beta, h]
    wins = np.zeros((len(sets.cls), 4), dtype=np.int64)
    for p in range(4):
        weaker = np.clip(p - (sets.counts[alpha, h] - 1), 0, 4)
        np.add.at(wins[:, p], alpha, _BINOM[weaker * 5 + dealer_high] * rest)
    return wins


def _area_hands(sets: _Multisets) -> IntArray:
    """(M, 4): area hands with each multiset whose high card has p weaker suits."""
    rows = np.arange(len(sets.cls))
    others = np.prod(_BINOM[4 * 5 + sets.counts], axis=1) // _BINOM[4 * 5 + sets.counts[rows, sets.high]]
    n_high = sets.counts[rows, sets.high]
    return np.stack([_BINOM[p * 5 + n_high - 1] * others for p in range(4)], axis=1)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class PairTable:
    """Ordered (area, dealer) pairs of disjoint hands, by (area category, dealer category).

    ``win``: the area's hand is stronger; ``tie``: exact tie (only without suit
    tie-breaks); ``loss``: the dealer's is stronger. Counts sum to ``PAIRS``.
    """

    win: Mapping[tuple[Category, Category], int]
    tie: Mapping[tuple[Category, Category], int]
    loss: Mapping[tuple[Category, Category], int]

    @property
    def total(self) -> int:
        return sum(self.win.values()) + sum(self.tie.values()) + sum(self.loss.values())


def pair_table(config: GoldenBullConfig = DEFAULT_CONFIG) -> PairTable:
    data = _counts(config.enabled, config.bomb_order)
    levels = data.sets.level
    area_all = data.area_hands.sum(axis=1)
    weighted = area_all[:, None] * data.by_level  # area hands x dealer hands, per dealer level
    same_level = data.by_level[np.arange(len(levels)), levels]
    within_below = data.below - _level_prefix(data)
    within_above = same_level - within_below - data.same
    if config.suit_tiebreak:
        suit_win = (data.area_hands * data.suit_wins).sum(axis=1)
        win_diag = area_all * within_below + suit_win
        loss_diag = area_all * (within_above + data.same) - suit_win
        tie_diag = np.zeros_like(win_diag)
    else:
        win_diag, tie_diag, loss_diag = area_all * within_below, area_all * data.same, area_all * within_above
    win, tie, loss = {}, {}, {}
    for area_cat, area_level in LEVEL.items():
        rows = levels == area_level
        for dealer_cat, dealer_level in LEVEL.items():
            key = (area_cat, dealer_cat)
            column = int(weighted[rows, dealer_level].sum())
            win[key] = column if dealer_level < area_level else 0
            loss[key] = column if dealer_level > area_level else 0
            tie[key] = 0
        diagonal = (area_cat, area_cat)
        win[diagonal] = int(win_diag[rows].sum())
        tie[diagonal] = int(tie_diag[rows].sum())
        loss[diagonal] = int(loss_diag[rows].sum())
    return PairTable(win, tie, loss)


def _level_prefix(data: _Counts) -> IntArray:
    """Dealer hands in categories below alpha's own category, per alpha."""
    cum = np.cumsum(data.by_level, axis=1)
    prefix = np.concatenate([np.zeros((len(cum), 1), dtype=np.int64), cum[:, :-1]], axis=1)
    result: IntArray = prefix[np.arange(len(cum)), data.sets.level]
    return result


@dataclass(frozen=True, slots=True)
class ExactRtp:
    """Exact expectations per unit staked on one area (before rounding to minor units)."""

    rtp: Fraction  # 1 + expected net
    win: Fraction  # probability the area's hand is stronger
    tie: Fraction  # probability of an exact tie
    loss: Fraction
    expected_win: Fraction  # expected amount won (after commission)
    expected_loss: Fraction  # expected amount lost, ties included when the dealer takes them
    expected_commission: Fraction
    second_moment: Fraction = Fraction(0)  # E[net^2] per unit staked

    @property
    def variance(self) -> Fraction:
        """Variance of one bet's net result per unit staked."""
        mean = self.rtp - 1
        return self.second_moment - mean * mean


def exact_rtp(config: GoldenBullConfig = DEFAULT_CONFIG) -> ExactRtp:
    """RTP of one area bet, every deal counted (about 1 s the first time per set of enabled specials)."""
    table = pair_table(config)
    keep = 1 - Fraction(config.commission_bps, BPS_DENOMINATOR)

    def cost(dealer: Category) -> Fraction:
        return Fraction(1) if config.mode is Mode.STAKE_CAPPED else config.multiplier(dealer)

    gross = sum((n * config.multiplier(a) for (a, _d), n in table.win.items()), Fraction(0)) / PAIRS
    lost = sum((n * cost(d) for (_a, d), n in table.loss.items()), Fraction(0))
    squares = sum((n * (config.multiplier(a) * keep) ** 2 for (a, _d), n in table.win.items()), Fraction(0))
    squares += sum((n * cost(d) ** 2 for (_a, d), n in table.loss.items()), Fraction(0))
    if config.exact_tie is ExactTie.DEALER:
        lost += sum((n * cost(d) for (_a, d), n in table.tie.items()), Fraction(0))
        squares += sum((n * cost(d) ** 2 for (_a, d), n in table.tie.items()), Fraction(0))
    won = gross * keep
    return ExactRtp(
        rtp=1 + won - lost / PAIRS,
        win=Fraction(sum(table.win.values()), PAIRS),
        tie=Fraction(sum(table.tie.values()), PAIRS),
        loss=Fraction(sum(table.loss.values()), PAIRS),
        expected_win=won,
        expected_loss=lost / PAIRS,
        expected_commission=gross - won,
        second_moment=squares / PAIRS,
    )


def hand_counts(cards: Sequence[Card], config: GoldenBullConfig = DEFAULT_CONFIG) -> tuple[int, int, int]:
    """(wins, exact ties, losses) of one area hand against every dealer hand from the other 47 cards."""
    hand = evaluate(cards, config)
    data = _counts(config.enabled, config.bomb_order)
    alpha = data.sets.codes[multiset_code(card.rank for card in hand.cards)]
    below, same = int(data.below[alpha]), int(data.same[alpha])
    if not config.suit_tiebreak:
        return below, same, DEALER_HANDS - below - same
    suit_wins = int(data.suit_wins[alpha, _suit_position(hand.high_card, config)])
    return below + suit_wins, 0, DEALER_HANDS - below - suit_wins


def _suit_position(card: Card, config: GoldenBullConfig) -> int:
    assert card.suit is not None
    return 3 - config.suit_order.index(card.suit.name)
