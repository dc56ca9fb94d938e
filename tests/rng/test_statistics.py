"""Statistical tests of the shuffle and the envelope split, deterministic by construction.

The card-by-position chi-square test runs over a pinned list of seeds, so its outcome
never changes from run to run: it cannot flake. Its false-alarm rate, over the choice
of that seed list, is the rejection threshold P_REJECT = 1e-6. To show that the test can
fail, the same statistic and threshold are applied to three deliberately broken
shuffles, each of which must be rejected. See docs/fairness.md, section 8.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bull import fairness as fair
from bull.cards import DECK_52

P_REJECT = 1e-6
DECK_SIZE = 52
SEED_COUNT = 200
ROUNDS_PER_SEED = 1000  # 200 seeds x 1000 round ids = 200 000 shuffles
BIASED_SHUFFLES = 50_000  # far fewer than the honest run: the test must reject even so
_MAX_SERIES_TERMS = 100_000

Counts = npt.NDArray[np.int64]
Permute = Callable[[fair.Stream, list[int]], None]


# --------------------------------------------------------------------------- chi-square p-values


def chi_square_sf(statistic: float, df: int) -> float:
    """P(X >= statistic) for X ~ chi-square(df): the regularised upper incomplete gamma Q(df/2, statistic/2)."""
    return gamma_q(df / 2, statistic / 2)


def gamma_q(a: float, x: float) -> float:
    """Q(a, x) = Gamma(a, x) / Gamma(a): series for x < a + 1, Lentz's continued fraction otherwise."""
    if a <= 0 or x < 0:
        raise ValueError(f"gamma_q needs a > 0 and x >= 0, got a={a}, x={x}")
    if x == 0:
        return 1.0
    log_prefix = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        # P(a, x) = e^-x x^a / Gamma(a + 1) * sum_n x^n / ((a + 1) ... (a + n))
        term = total = 1.0 / a
        for n in range(1, _MAX_SERIES_TERMS):
            term *= x / (a + n)
            total += term
            if abs(term) < abs(total) * 1e-16:
                return max(0.0, 1.0 - total * math.exp(log_prefix))
        raise ArithmeticError(f"gamma series did not converge for a={a}, x={x}")
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, _MAX_SERIES_TERMS):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        step = d * c
        h *= step
        if abs(step - 1) < 1e-16:
            return math.exp(log_prefix) * h
    raise ArithmeticError(f"gamma continued fraction did not converge for a={a}, x={x}")


def wilson_hilferty_sf(statistic: float, df: int) -> float:
    """Normal approximation of the chi-square tail, (X/df)^(1/3) ~ N(1 - 2/(9df), 2/(9df))."""
    variance = 2 / (9 * df)
    z = ((statistic / df) ** (1 / 3) - (1 - variance)) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("x", [0.01, 0.5, 1.0, 3.0, 10.0, 40.0])
def test_gamma_q_closed_forms(x: float) -> None:
    assert gamma_q(1, x) == pytest.approx(math.exp(-x), rel=1e-12)  # chi-square with 2 df
    assert gamma_q(0.5, x) == pytest.approx(math.erfc(math.sqrt(x)), rel=1e-10)  # 1 df
    assert gamma_q(2, x) == pytest.approx((1 + x) * math.exp(-x), rel=1e-12)


@pytest.mark.parametrize(
    ("statistic", "df", "p"),
    # Standard table quantiles of the chi-square distribution.
    [(29.588, 10, 0.001), (3.841, 1, 0.05), (124.342, 100, 0.05), (149.449, 100, 0.001)],
)
def test_chi_square_sf_table_values(statistic: float, df: int, p: float) -> None:
    assert chi_square_sf(statistic, df) == pytest.approx(p, rel=2e-3)


@pytest.mark.parametrize("statistic", [2300.0, 2601.0, 2800.0, 2950.0, 3100.0])
def test_chi_square_sf_agrees_with_wilson_hilferty_at_our_df(statistic: float) -> None:
    df = (DECK_SIZE - 1) ** 2
    assert chi_square_sf(statistic, df) == pytest.approx(wilson_hilferty_sf(statistic, df), rel=0.02)


# --------------------------------------------------------------------------- card-by-position test


def pinned_seeds() -> Iterator[bytes]:
    for k in range(SEED_COUNT):
        yield hashlib.sha256(f"niuniu-stat-{k}".encode()).digest()


def card_position_counts(decks: Iterator[list[int]], size: int) -> Counts:
    """counts[card, position] over all decks (each a list of card indices by position)."""
    positions = np.arange(size, dtype=np.int64)
    chunk: list[list[int]] = []
    counts = np.zeros(size * size, dtype=np.int64)
    for deck_indices in decks:
        chunk.append(deck_indices)
        if len(chunk) == ROUNDS_PER_SEED:
            counts += np.bincount((np.asarray(chunk, dtype=np.int64) * size + positions).ravel(), minlength=size**2)
            chunk.clear()
    if chunk:
        counts += np.bincount((np.asarray(chunk, dtype=np.int64) * size + positions).ravel(), minlength=size**2)
    return counts.reshape(size, size)


def chi_square_test(counts: Counts) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) for uniform card-by-position counts."""
    size = counts.shape[0]
    shuffles = int(counts.sum()) // size
    assert (counts.sum(axis=0) == shuffles).all() and (counts.sum(axis=1) == shuffles).all()
    expected = shuffles / size
    statistic = float(((counts - expected) ** 2).sum() / expected)
    df = (size - 1) ** 2  # every row and column total is fixed
    return statistic, df, chi_square_sf(statistic, df)


def real_shuffles() -> Iterator[list[int]]:
    index_of = {id(card): card.index for card in DECK_52}  # shuffle returns the canonical Card objects
    for seed in pinned_seeds():
        for j in range(ROUNDS_PER_SEED):
            yield [index_of[id(card)] for card in fair.shuffle(seed, f"stat-{j}", "", DECK_SIZE)]


def test_real_shuffle_passes_card_by_position_chi_square() -> None:
    counts = card_position_counts(real_shuffles(), DECK_SIZE)
    assert int(counts.sum()) == SEED_COUNT * ROUNDS_PER_SEED * DECK_SIZE
    statistic, df, p = chi_square_test(counts)
    assert p >= P_REJECT, f"chi-square {statistic:.1f} with {df} df, p = {p:.3g}: shuffle looks biased"


def _naive_swap_with_any(stream: fair.Stream, items: list[int]) -> None:
    for i in range(len(items)):
        j = stream.uniform(len(items))
        items[i], items[j] = items[j], items[i]


def _byte_modulo(stream: fair.Stream, items: list[int]) -> None:
    for i in range(len(items) - 1, 0, -1):
        j = stream.bits(8) % (i + 1)
        items[i], items[j] = items[j], items[i]


def _sattolo_off_by_one(stream: fair.Stream, items: list[int]) -> None:
    for i in range(len(items) - 1, 0, -1):
        j = stream.uniform(i)
        items[i], items[j] = items[j], items[i]


def biased_shuffles(permute: Permute) -> Iterator[list[int]]:
    """The first BIASED_SHUFFLES (seed, round id) pairs of the pinned list, shuffled by ``permute``."""
    pairs = ((seed, j) for seed in pinned_seeds() for j in range(ROUNDS_PER_SEED))
    for seed, j in itertools.islice(pairs, BIASED_SHUFFLES):
        items = list(range(DECK_SIZE))
        permute(fair.Stream(seed, fair.PURPOSE_DECK, f"stat-{j}", ""), items)
        yield items


@pytest.mark.parametrize("permute", [_naive_swap_with_any, _byte_modulo, _sattolo_off_by_one])
def test_biased_shuffles_are_rejected(permute: Permute) -> None:
    statistic, df, p = chi_square_test(card_position_counts(biased_shuffles(permute), DECK_SIZE))
    assert p < P_REJECT, f"{permute.__name__}: chi-square {statistic:.1f} with {df} df, p = {p:.3g}"


def test_honest_permute_through_the_same_harness_passes() -> None:
    """The harness used for the biased variants is not itself what makes them fail."""
    statistic, df, p = chi_square_test(
        card_position_counts(biased_shuffles(lambda stream, items: stream.shuffle_in_place(items)), DECK_SIZE)
    )
    assert p >= P_REJECT, f"chi-square {statistic:.1f} with {df} df, p = {p:.3g}"


# --------------------------------------------------------------------------- envelope


@settings(max_examples=300, deadline=None)
@given(
    seed=st.binary(min_size=32, max_size=32),
    shares=st.integers(1, 200),
    least=st.integers(1, 10_000),
    extra=st.integers(0, 10**12),
)
def test_envelope_shares_respect_min_and_sum_to_total(seed: bytes, shares: int, least: int, extra: int) -> None:
    total = shares * least + extra
    split = fair.split_envelope(seed, "round", "", total, shares, least)
    assert len(split.amounts) == shares
    assert min(split.amounts) >= least
    assert sum(split.amounts) == total
    assert sorted(split.grab_order) == list(range(shares))
    assert sum(split.by_position) == total


@pytest.mark.parametrize(("total", "shares", "least", "splits"), [(1000, 5, 1, 20_000), (68_800, 20, 1, 20_000)])
def test_envelope_means_are_fair(total: int, shares: int, least: int, splits: int) -> None:
    seed = hashlib.sha256(b"niuniu-envelope-stat").digest()
    amounts = np.zeros((splits, shares), dtype=np.int64)
    received = np.zeros((splits, shares), dtype=np.int64)
    grabs = np.zeros((splits, shares), dtype=np.int64)
    for number in range(splits):
        split = fair.split_envelope(seed, f"env-{number}", "", total, shares, least)
        amounts[number] = split.amounts
        received[number] = split.by_position
        grabs[number] = split.grab_order
    mean = total / shares
    # Each grab position (share drawn k-th) and each participant position gets total/shares on
    # average: every column mean lies within 5 standard errors of it (and that is within 3%).
    for sample in (amounts, received):
        tolerance = 5 * sample.std(axis=0) / math.sqrt(splits)
        assert (tolerance < 0.03 * mean).all(), tolerance
        assert (np.abs(sample.mean(axis=0) - mean) <= tolerance).all(), sample.mean(axis=0)
    # The grab order is uniform: each participant grabs first about 1/shares of the time.
    first = np.bincount(grabs[:, 0], minlength=shares) / splits
    assert np.allclose(first, 1 / shares, rtol=0.1), first
