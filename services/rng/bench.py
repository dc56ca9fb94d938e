"""Benchmark of the provably-fair derivation: ``python -m services.rng.bench``.

Prints shuffles per second (52 and 54 cards), envelope splits per second, sealed deck
records sealed and opened per second, and client seed combinations per second, each
measured over a fixed wall-clock budget on one core, fresh seed and round id every call.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

from bull.fairness import combine_client_seeds, deck_record, open_sealed, seal, shuffle, split_envelope
from services.rng.seeds import new_seal_nonce, new_server_seed

MAX_CALLS_PER_CASE = 10_000_000


def rate_per_s(call: Callable[[bytes, str], object], seconds: float) -> tuple[float, int]:
    """Calls per second of ``call(seed, round_id)`` over about ``seconds`` of wall clock."""
    seeds = [new_server_seed() for _ in range(64)]
    calls = 0
    started = time.perf_counter()
    deadline = started + seconds
    while calls < MAX_CALLS_PER_CASE:
        for _ in range(100):
            call(seeds[calls % len(seeds)], f"bench-{calls}")
            calls += 1
        if time.perf_counter() >= deadline:
            break
    return calls / (time.perf_counter() - started), calls


def _seal_and_open(seed: bytes, round_id: str, record: bytes, nonce: bytes) -> bytes:
    return open_sealed(seed, "deck", round_id, nonce, seal(seed, "deck", round_id, record, nonce))


def cases() -> list[tuple[str, str, Callable[[bytes, str], object]]]:
    record = deck_record("bench", "0" * 64, 52, "", [], [card.code for card in shuffle(bytes(32), "bench")])
    nonce = new_seal_nonce()
    contributions = [f"seed-{n}" for n in range(100)]
    return [
        ("shuffle 52", "shuffles/s", lambda seed, round_id: shuffle(seed, round_id, "", 52)),
        ("shuffle 54", "shuffles/s", lambda seed, round_id: shuffle(seed, round_id, "", 54)),
        ("split 10 shares", "splits/s", lambda seed, round_id: split_envelope(seed, round_id, "", 100_000, 10, 1)),
        ("split 100 shares", "splits/s", lambda seed, round_id: split_envelope(seed, round_id, "", 1_000_000, 100, 1)),
        ("seal+open deck", "records/s", lambda seed, round_id: _seal_and_open(seed, round_id, record, nonce)),
        ("combine 100 seeds", "rounds/s", lambda seed, round_id: combine_client_seeds(contributions)),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.rng.bench", description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="wall-clock budget per case (default 2)")
    args = parser.parse_args(argv)
    for name, unit, call in cases():
        rate, calls = rate_per_s(call, args.seconds)
        print(f"{name:<18} {rate:>12,.0f} {unit}  ({calls:,} calls, {1e6 / rate:.1f} us each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
