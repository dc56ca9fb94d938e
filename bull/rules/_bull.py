"""The bull calculation shared by every card variant.

A hand has a bull when some three cards sum to a multiple of 10; its points are
then the other two cards' total mod 10, with 0 read as 10 ("Bull Bull"). Since
the five cards' total is fixed, the remaining pair's total is the same mod 10
whichever triple is chosen, so the points are just the total mod 10: the only
question is whether *some* triple works. The triple's complement is a pair, so
that is "some pair has the same total mod 10 as the whole hand" (10 pairs to
try instead of 10 triples to sum).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

NO_BULL = 0
BULL_BULL = 10


def bull_points(values: Sequence[int]) -> int:
    """0 for no bull, 1..9 for Bull 1..9, 10 for Bull Bull (values: A=1 .. 10/J/Q/K=10)."""
    target = sum(values) % 10
    for a, b in combinations(values, 2):
        if (a + b) % 10 == target:
            return target or BULL_BULL
    return NO_BULL
