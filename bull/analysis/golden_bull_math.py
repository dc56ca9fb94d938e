"""Golden Bull hand census: how many of the C(52,5) hands fall in each category.

A hand's category depends on its ranks only, so the census counts over the 6,175
rank multisets and weighs each by the number of ways to give it suits.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from math import comb

from bull.rules import golden_bull as gb


def census(config: gb.GoldenBullConfig | None = None) -> dict[gb.Category, int]:
    """How many of the C(52,5) hands fall in each category with ``config``'s specials enabled.

    A multiset with rank counts n_r is dealt in prod C(4, n_r) ways (suits), and
    the category depends on ranks only, so 6,175 multisets cover 2,598,960 hands.
    """
    counts = _census((config or gb.DEFAULT_CONFIG).enabled)
    return dict(zip(gb.CATEGORIES, counts, strict=True))


@lru_cache(maxsize=16)  # one per subset of the four specials
def _census(enabled: frozenset[gb.Category]) -> tuple[int, ...]:
    counts = dict.fromkeys(gb.CATEGORIES, 0)
    for ranks in gb.rank_multisets():
        category, _points, _four = gb.classify(ranks, enabled)
        counts[category] += suit_ways(ranks)
    return tuple(counts.values())


def suit_ways(ranks: Sequence[int]) -> int:
    """Number of distinct hands with these ranks: prod over ranks of C(4, count)."""
    ways = 1
    for rank in set(ranks):
        ways *= comb(4, ranks.count(rank))
    return ways
