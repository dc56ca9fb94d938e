"""Independent reference implementations for the rules tests.

The evaluators here are written straight from the rules pages (docs/rules), as differently from
the production code as is practical: they try every triple of cards (instead
of the pair shortcut), count ranks card by card, try every rank for every joker
(instead of closed forms), and run over *all* hands with numpy. They are slow
in the way that makes them obviously right.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain, combinations
from math import comb

import numpy as np
import numpy.typing as npt
import pytest

Array = npt.NDArray[np.int64]

GOLDEN_SPECIALS = ["five_small", "bomb", "five_face", "four_face"]
BULLS = ["bull_bull", *[f"bull_{p}" for p in range(9, 0, -1)], "no_bull"]
GOLDEN_ORDER = [*GOLDEN_SPECIALS, *BULLS]
BAIBIAN_ORDER = ["bomb", "gold", "silver", *BULLS]


def all_hands(deck_size: int) -> Array:
    """Every 5-card combination of ``range(deck_size)`` as an (N, 5) array."""
    flat = np.fromiter(chain.from_iterable(combinations(range(deck_size), 5)), dtype=np.int64)
    hands = flat.reshape(-1, 5)
    assert len(hands) == comb(deck_size, 5)
    return hands


def naive_points(values: Array) -> Array:
    """0 no bull, 1..9, 10 Bull Bull: the first triple summing to a multiple of 10 decides."""
    columns = [values[:, i].astype(np.int16) for i in range(5)]
    total = sum(columns[1:], columns[0])
    points = np.zeros(len(values), dtype=np.int64)
    found = np.zeros(len(values), dtype=bool)
    for i, j, k in combinations(range(5), 3):
        triple_sum = columns[i] + columns[j] + columns[k]
        hit = (triple_sum % 10 == 0) & ~found
        rest = (total - triple_sum) % 10
        points[hit] = np.where(rest[hit] == 0, 10, rest[hit])
        found |= hit
    return points


def four_of_a_rank(ranks: Array) -> Array:
    """Some rank appears at least four times: in sorted order, four equal neighbours."""
    ordered = np.sort(ranks, axis=1)
    result: Array = (ordered[:, 0] == ordered[:, 3]) | (ordered[:, 1] == ordered[:, 4])
    return result


def points_index(points: Array, order: list[str]) -> Array:
    names = np.array(["no_bull", *[f"bull_{p}" for p in range(1, 10)], "bull_bull"])[points]
    lookup = {name: i for i, name in enumerate(order)}
    return np.array([lookup[name] for name in names], dtype=np.int64) if len(names) else np.zeros(0, dtype=np.int64)


def naive_golden(hands: Array, enabled: frozenset[str] = frozenset(GOLDEN_ORDER[:4])) -> tuple[Array, Array]:
    """(category index into GOLDEN_ORDER, points) for (N, 5) card indices."""
    ranks = hands % 13 + 1
    values = np.minimum(ranks, 10)
    points = naive_points(values)
    faces = (ranks >= 11).sum(axis=1)
    rules = {
        "five_small": (values <= 4).all(axis=1) & (values.sum(axis=1) <= 10),
        "bomb": four_of_a_rank(ranks),
        "five_face": faces == 5,
        "four_face": (faces == 4) & (ranks == 10).any(axis=1),
    }
    category = _points_lookup(points, GOLDEN_ORDER)
    for name in reversed(GOLDEN_ORDER[:4]):  # strongest applied last, so it wins
        if name in enabled:
            category = np.where(rules[name], GOLDEN_ORDER.index(name), category)
    return category, points


def _points_lookup(points: Array, order: list[str]) -> Array:
    table = np.array([order.index("no_bull"), *[order.index(f"bull_{p}") for p in range(1, 10)]])
    table = np.append(table, order.index("bull_bull"))
    result: Array = table[points]
    return result


def naive_golden_key(hands: Array, suit_order: str = "SHCD", suit_tiebreak: bool = True) -> Array:
    """A comparable integer per hand: category, rank of a bomb's four, points, high rank, high suit."""
    category, points = naive_golden(hands)
    ranks = hands % 13 + 1
    suits = hands // 13
    suit_strength = np.array([3 - suit_order.index(s) for s in "SHCD"])[suits]
    card = ranks * 4 + (suit_strength if suit_tiebreak else 0)
    high = card.max(axis=1)
    four = np.where(category == GOLDEN_ORDER.index("bomb"), np.sort(ranks, axis=1)[:, 2], 0)
    result: Array = (len(GOLDEN_ORDER) - category) << 20 | four << 16 | points << 8 | high
    return result


def naive_baibian(hands: Array) -> Array:
    """Category index into BAIBIAN_ORDER for (N, 5) card indices 0..53, jokers at every rank."""
    is_joker = hands >= 52
    best = np.full(len(hands), len(BAIBIAN_ORDER), dtype=np.int64)
    for jokers in range(3):
        rows = np.flatnonzero(is_joker.sum(axis=1) == jokers)
        if len(rows) == 0:
            continue
        plain = np.sort(np.where(is_joker[rows], 99, hands[rows]), axis=1)[:, : 5 - jokers] % 13 + 1
        for extra in np.ndindex(*([13] * jokers)):
            ranks = np.concatenate([plain, np.tile(np.array(extra, dtype=np.int64) + 1, (len(rows), 1))], axis=1)
            best[rows] = np.minimum(best[rows], _baibian_plain(ranks))
    return best


def _baibian_plain(ranks: Array) -> Array:
    values = np.minimum(ranks, 10)
    faces = (ranks >= 11).sum(axis=1)
    category = _points_lookup(naive_points(values), BAIBIAN_ORDER)
    category = np.where((faces == 4) & (ranks == 10).any(axis=1), BAIBIAN_ORDER.index("silver"), category)
    category = np.where(faces == 5, BAIBIAN_ORDER.index("gold"), category)
    result: Array = np.where(four_of_a_rank(ranks), BAIBIAN_ORDER.index("bomb"), category)
    return result


@pytest.fixture(scope="session")
def hands_52() -> Array:
    return all_hands(52)


@pytest.fixture(scope="session")
def hands_54() -> Array:
    return all_hands(54)


@pytest.fixture(scope="session")
def combos_47() -> Array:
    return all_hands(47)


@pytest.fixture(scope="session")
def golden_reference() -> Callable[..., tuple[Array, Array]]:
    return naive_golden


@pytest.fixture(scope="session")
def golden_key() -> Callable[..., Array]:
    return naive_golden_key


@pytest.fixture(scope="session")
def baibian_reference() -> Callable[[Array], Array]:
    return naive_baibian
