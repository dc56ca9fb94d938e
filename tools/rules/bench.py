"""Benchmarks for the rules engine: ``python -m tools.rules.bench``.

Prints what this machine measures; nothing here is asserted in tests. Targets
from the issue, for reference: Golden Bull census <= 1 s, one hand through
``golden_bull.evaluate`` <= 5 us, numpy batch >= 5 M hands/s, Monte Carlo
>= 1 M rounds/s (dealer + 3 areas), exact RTP with card removal <= 5 s.
"""

from __future__ import annotations

import argparse
import json
import time
import timeit
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from bull.analysis import baibian_bull_math, fast, golden_bull_math
from bull.analysis import exact as _exact
from bull.cards import DECK_52, DECK_54
from bull.rules import baibian_bull as bb
from bull.rules import golden_bull as gb

T = TypeVar("T")


def _timed(function: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    result = function()
    return result, time.perf_counter() - started


def _clear_caches() -> None:
    """Cold start: measured figures include building every lookup table."""
    gb._rank_tables.cache_clear()
    golden_bull_math._census.cache_clear()
    fast._base_table.cache_clear()
    _exact._counts.cache_clear()
    bb.category_table.cache_clear()


def golden_figures(rounds: int, batch: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    _clear_caches()
    counts, census_cold = _timed(lambda: golden_bull_math.census(gb.GoldenBullConfig()))
    assert sum(counts.values()) == 2_598_960
    _, census_warm = _timed(golden_bull_math.census)
    hands = [tuple(DECK_52[i] for i in rng.choice(52, 5, replace=False)) for _ in range(1000)]
    loops = 200
    per_hand = timeit.timeit(lambda: [gb.evaluate(h) for h in hands], number=loops) / (loops * len(hands))
    cards = np.argsort(rng.random((batch, 52)), axis=1)[:, :5].astype(np.uint8)
    fast.evaluate_batch(cards[:1000])
    _, batch_seconds = _timed(lambda: fast.evaluate_batch(cards))
    _, mc_seconds = _timed(lambda: fast.simulate(gb.DEFAULT_CONFIG, rounds, np.random.default_rng(seed)))
    exact, exact_seconds = _timed(lambda: _exact.exact_rtp(gb.GoldenBullConfig()))
    assert exact.rtp == 1
    return {
        "census_cold_s": census_cold,
        "census_warm_s": census_warm,
        "evaluate_us": per_hand * 1e6,
        "batch_hands_per_s": batch / batch_seconds,
        "monte_carlo_rounds_per_s": rounds / mc_seconds,
        "exact_rtp_cold_s": exact_seconds,
    }


def baibian_figures(rounds: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    counts, census_cold = _timed(baibian_bull_math.census)
    assert sum(counts.values()) == 3_162_510
    hands = [tuple(DECK_54[i] for i in rng.choice(54, 5, replace=False)) for _ in range(1000)]
    loops = 100
    per_hand = timeit.timeit(lambda: [bb.evaluate(h) for h in hands], number=loops) / (loops * len(hands))
    _, mc_seconds = _timed(lambda: fast.simulate_baibian(bb.DEFAULT_CONFIG, rounds, np.random.default_rng(seed)))
    return {
        "census_cold_s": census_cold,
        "evaluate_us": per_hand * 1e6,
        "monte_carlo_rounds_per_s": rounds / mc_seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.rules.bench", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2_000_000, help="Monte Carlo rounds per variant")
    parser.add_argument("--batch", type=int, default=4_000_000, help="hands in the numpy batch")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    figures = {
        "golden_bull": golden_figures(args.rounds, args.batch, args.seed),
        "baibian_bull": baibian_figures(args.rounds, args.seed),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    for variant, values in figures.items():
        print(variant)
        for name, value in values.items():
            print(f"  {name:<26} {value:>14,.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
