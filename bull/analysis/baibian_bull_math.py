"""Hundred-player Bull with jokers: the hand census and the exact variance of an area bet.

A hand's category depends only on its (rank multiset, joker count) type, so every
count here is a sum over types weighed by the ways to deal them from a 54-card deck;
``tests/rules`` checks the census against a brute force over all C(54,5) hands.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from math import comb

import numpy as np

from bull.analysis.golden_bull_math import suit_ways
from bull.rules import baibian_bull as bb


def census() -> dict[bb.Category, int]:
    """All C(54,5) = 3,162,510 hands by category, counted over (rank multiset, joker count).

    A multiset with rank counts n_r and j jokers is dealt in prod C(4, n_r) * C(2, j) ways.
    """
    counts = dict.fromkeys(bb.CATEGORIES, 0)
    for (ranks, jokers), category in bb.category_table().items():
        counts[category] += suit_ways(ranks) * (1, 2, 1)[jokers]
    return counts


@lru_cache(maxsize=1)
def pair_category_counts() -> tuple[tuple[int, ...], ...]:
    """``counts[i][j]``: ordered pairs of disjoint hands from one 54-card deck whose categories are
    ``CATEGORIES[i]`` and ``CATEGORIES[j]``; all C(54,5) x C(49,5) of them, counted exactly.

    A hand's category depends only on its (rank multiset, joker count) type. Given the first
    hand's type, the second is drawn from what is left: ``prod_r C(4 - a_r, b_r)`` ways for rank
    counts ``b`` and ``C(2 - j, k)`` for its jokers, summed by the second hand's category.
    """
    types = list(bb.category_table().items())
    counts = np.zeros((len(types), 13), dtype=np.int64)
    jokers = np.array([j for (_, j), _ in types], dtype=np.int64)
    categories = np.array([bb.CATEGORIES.index(c) for _, c in types], dtype=np.int64)
    for t, ((ranks, _), _) in enumerate(types):
        for rank in ranks:
            counts[t, rank - 1] += 1
    ways = np.array([[comb(n, k) for k in range(5)] for n in range(5)], dtype=np.int64)
    joker_ways = np.array([[comb(n, k) for k in range(3)] for n in range(3)], dtype=np.int64)
    joint = np.zeros((len(bb.CATEGORIES), len(bb.CATEGORIES)), dtype=np.int64)
    for a in range(len(types)):
        first = int(np.prod(ways[4, counts[a]])) * int(joker_ways[2, jokers[a]])
        second = np.prod(ways[4 - counts[a][None, :], counts], axis=1) * joker_ways[2 - jokers[a], jokers]
        # bincount sums in float64: exact, every sum stays far below 2**53.
        joint[categories[a]] += first * np.bincount(categories, weights=second, minlength=len(bb.CATEGORIES)).astype(
            np.int64
        )
    return tuple(tuple(int(n) for n in row) for row in joint)


def exact_bet_variance(config: bb.BaibianBullConfig | None = None) -> Fraction:
    """The exact variance of one area bet's net per unit staked.

    Two hands from one deck never tie and the stronger one's category is the higher of the two,
    so a bet nets + or - the multiplier of the higher category; the mean is 0 (the pair is
    exchangeable), so the variance is the mean of that multiplier squared over every pair.
    """
    config = config or bb.DEFAULT_CONFIG
    joint = pair_category_counts()
    total = sum(map(sum, joint))
    second_moment = sum(
        n * config.multipliers[min(i, j)] ** 2 for i, row in enumerate(joint) for j, n in enumerate(row)
    )
    return Fraction(second_moment) / total
