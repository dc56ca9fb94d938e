"""Table-driven numpy evaluation of Golden Bull hands, Monte Carlo and exact RTP.

These are for batch work (census, math reports, benchmarks): the per-hand
public API is ``golden_bull.evaluate``, and ``tests/rules`` pins the two to
the same ``strength`` on random hands.

Cards are canonical indices (``Card.index``: suit * 13 + rank - 1). A hand's
``strength`` is the same integer as ``GoldenBullHand.strength``. The batch
evaluator sorts each hand's five card keys (rank << 2 | suit strength) with a
9-comparator sorting network on uint8 columns, turns the sorted ranks into the
colex index of their multiset (C(19, 5) slots: ranks 1..15, jokers included) and reads the
rank-multiset part of the strength from a table; the largest key is the high
card. Everything is whole-array numpy work, no Python per hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from math import comb, sqrt

import numpy as np
import numpy.typing as npt

from bull.cards import BIG_JOKER_RANK, DECK_54, SMALL_JOKER_RANK
from bull.money import BPS_DENOMINATOR
from bull.rules import baibian_bull as bb
from bull.rules.golden_bull import (
    CATEGORIES,
    DEFAULT_CONFIG,
    LEVEL,
    BombOrder,
    Category,
    ExactTie,
    GoldenBullConfig,
    Mode,
    base_strength,
    classify,
    rank_multisets,
)

# Called as progress(done, total); the CLI draws a bar (same shape as tools.rules.adapter.ProgressFn).
ProgressFn = Callable[[int, int], None]
IntArray = npt.NDArray[np.int64]
I32Array = npt.NDArray[np.int32]
I16Array = npt.NDArray[np.int16]
U8Array = npt.NDArray[np.uint8]

HAND = 5
# An optimal sorting network for 5 inputs (Knuth, TAOCP 5.3.4).
SORT5 = ((0, 1), (3, 4), (2, 4), (2, 3), (0, 3), (0, 2), (1, 4), (1, 3), (1, 2))
MAX_RANK = 15  # the big joker; golden_bull only uses 1..13
MULTISET_SLOTS = comb(MAX_RANK + HAND - 1, HAND)
_NO_HAND = -1


@dataclass(frozen=True, slots=True)
class BatchTables:
    """Lookup tables for one config; see the module docstring."""

    card_key: U8Array  # card index -> rank << 2 | suit strength
    colex: tuple[I16Array, ...]  # colex[j][key] = C(rank - 1 + j, j + 1) for the j-th smallest card
    base: I32Array  # multiset colex index -> base strength (_NO_HAND for five of a kind)
    high_mask: int


def tables(config: GoldenBullConfig = DEFAULT_CONFIG) -> BatchTables:
    high_mask = 0b111111 if config.suit_tiebreak else 0b111100
    base = _base_table(config.enabled, config.bomb_order)
    return BatchTables(_card_keys(config.suit_order), _colex_tables(), base, high_mask)


@lru_cache(maxsize=24)
def _card_keys(suit_order: str) -> U8Array:
    suit_strength = [3 - suit_order.index(s) for s in "SHCD"]
    return np.array([(i % 13 + 1) << 2 | suit_strength[i // 13] for i in range(52)], dtype=np.uint8)


@lru_cache(maxsize=32)
def _base_table(enabled: frozenset[Category], bomb_order: BombOrder = BombOrder.RANK_OF_FOUR) -> I32Array:
    base = np.full(MULTISET_SLOTS, _NO_HAND, dtype=np.int32)
    for ranks in rank_multisets():
        category, points, four = classify(ranks, enabled)
        four = four if bomb_order is BombOrder.RANK_OF_FOUR else 0
        base[colex_index(ranks)] = base_strength(category, points, four)
    return base


@lru_cache(maxsize=1)
def _colex_tables() -> tuple[I16Array, ...]:
    keys = range(64)
    return tuple(
        np.array([comb((k >> 2) - 1 + j, j + 1) if k >= 4 else 0 for k in keys], dtype=np.int16) for j in range(HAND)
    )


def colex_index(sorted_ranks: tuple[int, ...]) -> int:
    """Index of a sorted rank multiset among all C(17, 5) multisets of 13 ranks."""
    return sum(comb(rank - 1 + j, j + 1) for j, rank in enumerate(sorted_ranks))


BATCH_CHUNK = 1 << 15  # rows per pass: keeps every temporary array in L2 cache


def evaluate_batch(cards: npt.ArrayLike, config: GoldenBullConfig = DEFAULT_CONFIG) -> I32Array:
    """Strengths of many hands: ``cards`` is (N, 5) card indices, each row five distinct cards."""
    table = tables(config)
    hands = np.asarray(cards)
    if hands.ndim != 2 or hands.shape[1] != HAND:
        raise ValueError(f"expected an (N, 5) array of card indices, got shape {hands.shape}")
    keys = np.take(table.card_key, hands.T)  # (5, N): one contiguous row per card position
    out = np.empty(len(hands), dtype=np.int32)
    for start in range(0, len(hands), BATCH_CHUNK):
        stop = start + BATCH_CHUNK
        out[start:stop] = strengths_from_keys([keys[j, start:stop] for j in range(HAND)], table)
    return out


def strengths_from_keys(columns: list[U8Array], table: BatchTables) -> I32Array:
    """Sort five key columns in place (network), then look up the multiset and add the high card."""
    for a, b in SORT5:
        low = np.minimum(columns[a], columns[b])
        np.maximum(columns[a], columns[b], out=columns[b])
        columns[a] = low
    index = np.take(table.colex[0], columns[0])
    for j in range(1, HAND):
        index += np.take(table.colex[j], columns[j])
    result: I32Array = np.take(table.base, index) | (columns[4] & table.high_mask)
    return result


def category_levels(strength: I32Array) -> I32Array:
    """Category level (``golden_bull.LEVEL``) of each strength."""
    return strength >> 14


# --------------------------------------------------------------------------- dealing for simulation


def deal_batch(rng: np.random.Generator, rounds: int, cards: int, *, deck_size: int = 52) -> U8Array:
    """(cards, rounds) card indices: the first ``cards`` of an unbiased shuffle per round.

    A vectorised partial Fisher-Yates: step i swaps position i with a uniform
    position in [i, deck_size), for every round at once (``Generator.integers`` is
    unbiased), and only the ``cards`` positions we use are drawn. For simulation
    only; real rounds are dealt from the rng service's shuffle.
    """
    decks = np.tile(np.arange(deck_size, dtype=np.uint8), rounds)
    offsets = np.arange(rounds, dtype=np.int64) * deck_size
    drawn = np.empty((cards, rounds), dtype=np.uint8)
    for i in range(cards):
        pick = offsets + rng.integers(i, deck_size, rounds)
        drawn[i] = decks[pick]
        decks[pick] = decks[offsets + i]
    return drawn


@dataclass(frozen=True, slots=True)
class MonteCarloResult:
    """Net result per unit staked on one area, estimated from ``rounds`` simulated rounds.

    Each round contributes the mean of its three area bets (they share the
    dealer, so the round, not the bet, is the independent sample).
    """

    rounds: int
    mean_net: float
    std_error: float
    bet_variance: float = 0.0  # variance of one bet's net result per unit staked (all bets pooled)

    @property
    def rtp(self) -> float:
        return 1.0 + self.mean_net

    @property
    def ci95(self) -> tuple[float, float]:
        return (self.rtp - 1.959964 * self.std_error, self.rtp + 1.959964 * self.std_error)


def simulate(
    config: GoldenBullConfig,
    rounds: int,
    rng: np.random.Generator,
    *,
    chunk: int = 1 << 17,
    progress: ProgressFn | None = None,
) -> MonteCarloResult:
    """Monte Carlo of Dealer vs three Areas with randomness passed in as ``rng``."""
    total = total_sq = bet_sq = 0.0
    done = 0
    for size in _chunks(rounds, chunk):
        net = _simulate_chunk(config, size, rng)
        per_round = net.mean(axis=0)
        total += float(per_round.sum())
        total_sq += float(np.square(per_round).sum())
        bet_sq += float(np.square(net).sum())
        done += size
        if progress is not None:
            progress(done, rounds)
    return _result(rounds, total, total_sq, bet_sq / (rounds * 3))


def _result(rounds: int, total: float, total_sq: float, bet_second_moment: float) -> MonteCarloResult:
    mean = total / rounds
    variance = max(total_sq / rounds - mean * mean, 0.0) * rounds / max(rounds - 1, 1)
    return MonteCarloResult(rounds, mean, sqrt(variance / rounds), bet_second_moment - mean * mean)


def _chunks(total: int, size: int) -> Iterator[int]:
    if total <= 0:
        raise ValueError("rounds must be positive")
    for start in range(0, total, size):
        yield min(size, total - start)


def _simulate_chunk(config: GoldenBullConfig, rounds: int, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """(3, rounds): each area bet's net result per unit staked."""
    table = tables(config)
    keys = np.take(table.card_key, deal_batch(rng, rounds, 4 * HAND))
    strength = strengths_from_keys([keys[j::HAND].reshape(-1) for j in range(HAND)], table).reshape(4, rounds)
    win_value, loss_value = _unit_values(config)
    dealer, areas = strength[0], strength[1:]
    net = np.where(areas > dealer, win_value[areas >> 14], 0.0)
    lost = (areas < dealer) | ((areas == dealer) & (config.exact_tie is ExactTie.DEALER))
    net -= np.where(lost, loss_value[dealer >> 14], 0.0)
    result: npt.NDArray[np.float64] = net
    return result


def _unit_values(config: GoldenBullConfig) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per category level: net for a unit win (after commission) and cost of a unit loss."""
    keep = 1 - Fraction(config.commission_bps, BPS_DENOMINATOR)
    win = np.zeros(len(CATEGORIES) + 1)
    loss = np.zeros(len(CATEGORIES) + 1)
    for category, level in LEVEL.items():
        win[level] = float(config.multiplier(category) * keep)
        loss[level] = 1.0 if config.mode is Mode.STAKE_CAPPED else float(config.multiplier(category))
    return win, loss


# --------------------------------------------------------------------------- baibian_bull


@lru_cache(maxsize=2)
def baibian_tables(bomb_order: bb.BombOrder = bb.BombOrder.GENERAL) -> BatchTables:
    """Tables for ``baibian_bull``: 54 cards, jokers as ranks 14 and 15.

    strength = level << 10 | rank of a Bomb's four << 6 (``rank_of_four`` only) | high card key,
    as ``BaibianHand.strength``.
    """
    card_key = np.array([bb.card_key(card) for card in DECK_54], dtype=np.uint8)
    base = np.full(MULTISET_SLOTS, _NO_HAND, dtype=np.int32)
    joker_sets = ((), (SMALL_JOKER_RANK,), (BIG_JOKER_RANK,), (SMALL_JOKER_RANK, BIG_JOKER_RANK))
    for (ranks, jokers), category in bb.category_table().items():
        four = bb.four_rank(ranks, jokers) if category is bb.Category.BOMB else 0
        four = four if bomb_order is bb.BombOrder.RANK_OF_FOUR else 0
        for extra in joker_sets:
            if len(extra) == jokers:
                base[colex_index((*ranks, *extra))] = bb.LEVEL[category] << BAIBIAN_LEVEL_SHIFT | four << 6
    return BatchTables(card_key, _colex_tables(), base, 0b111111)


BAIBIAN_LEVEL_SHIFT = 10


def evaluate_baibian_batch(cards: npt.ArrayLike, config: bb.BaibianBullConfig | None = None) -> I32Array:
    """Strengths (``BaibianHand.strength``) of (N, 5) card indices 0..53."""
    hands = np.asarray(cards)
    if hands.ndim != 2 or hands.shape[1] != HAND:
        raise ValueError(f"expected an (N, 5) array of card indices, got shape {hands.shape}")
    table = baibian_tables((config or bb.DEFAULT_CONFIG).bomb_order)
    keys = np.take(table.card_key, hands.T)
    return strengths_from_keys([keys[j] for j in range(HAND)], table)


def simulate_baibian(
    config: bb.BaibianBullConfig,
    rounds: int,
    rng: np.random.Generator,
    *,
    chunk: int = 1 << 16,
    progress: ProgressFn | None = None,
) -> MonteCarloResult:
    """Monte Carlo of the banker against the four areas; one sample = the mean of a round's four bets.

    The burn card and the round-robin order do not change the distribution of
    the five hands under a uniform shuffle, so the simulation deals 25 cards in
    blocks of five (banker first) from a partial Fisher-Yates of the 54 cards.
    """
    multipliers = np.zeros(len(bb.CATEGORIES) + 1)
    for category, level in bb.LEVEL.items():
        multipliers[level] = float(config.multiplier(category))
    total = total_sq = bet_sq = 0.0
    done = 0
    table = baibian_tables(config.bomb_order)
    for size in _chunks(rounds, chunk):
        keys = np.take(table.card_key, deal_batch(rng, size, 5 * HAND, deck_size=54))
        strength = strengths_from_keys([keys[j::HAND].reshape(-1) for j in range(HAND)], table).reshape(5, size)
        banker, areas = strength[0], strength[1:]
        net = np.where(areas > banker, multipliers[areas >> BAIBIAN_LEVEL_SHIFT], 0.0)
        net -= np.where(areas < banker, multipliers[banker >> BAIBIAN_LEVEL_SHIFT], 0.0)
        per_round = net.mean(axis=0)
        total += float(per_round.sum())
        total_sq += float(np.square(per_round).sum())
        bet_sq += float(np.square(net).sum())
        done += size
        if progress is not None:
            progress(done, rounds)
    return _result(rounds, total, total_sq, bet_sq / (rounds * len(bb.AREAS)))
