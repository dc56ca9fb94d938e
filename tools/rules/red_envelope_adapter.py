"""The ``red_envelope_bull`` adapter for the ``niuniu-rules`` CLI and the math report.

A "hand" is an envelope amount (``3.42``, ``RM3.42``); ``eval`` and ``compare``
take one amount each. Besides the game's config keys, ``rtp`` reads three
simulation-only settings, which are not part of the game's configuration:
``sim.participants`` (dealer + players, default 5), ``sim.stake_minor`` (each
player's stake, default 1000) and ``sim.dealer_pool_minor`` (default
``unlimited``). With ``rounds=None`` and two participants and an unlimited pool
the figure is exact; otherwise it is a Monte Carlo of the double-mean split.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from bull.analysis import red_envelope_math as rm
from bull.rules import red_envelope as re_
from bull.rules.config import ConfigError, Settings, as_int, flatten
from tools.rules.adapter import CommandResult, ProgressFn

DEFAULT_MC_ROUNDS = 500_000
DEFAULT_PARTICIPANTS = 5
DEFAULT_STAKE_MINOR = 1000
REPORT_SEED = 20_240_603
SIM_KEYS = ("sim.participants", "sim.stake_minor", "sim.dealer_pool_minor")


def _amount(hand: Sequence[str]) -> re_.EnvelopeHand:
    items = " ".join(hand).split()
    if len(items) != 1:
        raise re_.AmountError(f"a red-envelope hand is one amount (e.g. 3.42), not {' '.join(hand)!r}")
    return re_.evaluate(re_.parse_amount(items[0]))


def _split_settings(settings: Settings) -> tuple[dict[str, object], dict[str, object]]:
    flat = flatten(settings)
    sim = {k: v for k, v in flat.items() if k in SIM_KEYS}
    return {k: v for k, v in flat.items() if k not in SIM_KEYS}, sim


def _pct(value: Fraction | float) -> str:
    return f"{float(value) * 100:.4f}%"


class RedEnvelopeAdapter:
    """Implements ``adapter.VariantAdapter`` for ``red_envelope_bull``."""

    @property
    def variant_id(self) -> str:
        return re_.VARIANT_ID

    @property
    def title(self) -> str:
        return "68 NiuNiu (red-envelope bull)"

    def eval(self, cards: Sequence[str], settings: Settings) -> CommandResult:
        config = re_.load_config(_split_settings(settings)[0])
        hand = _amount(cards)
        multiplier = config.multiplier(hand.category)
        data = {
            "amount": hand.text,
            "amount_minor": hand.amount_minor,
            "digits": "".join(str(d) for d in re_.digits(hand.amount_minor)),
            "category": hand.category,
            "points": hand.points,
            "multiplier": multiplier,
        }
        name = re_.CATEGORY_NAMES[hand.category]
        if hand.category in re_.SPECIAL_CATEGORIES:
            name += f" ({hand.points} points)"
        text = f"{hand.text}: {name}, x{multiplier}"
        return CommandResult(data, text)

    def compare(self, hand_a: Sequence[str], hand_b: Sequence[str], settings: Settings) -> CommandResult:
        re_.load_config(_split_settings(settings)[0])
        a, b = _amount(hand_a), _amount(hand_b)
        result = re_.compare(a, b)
        winner = {1: "a", 0: "tie", -1: "b"}[result]
        reason = re_.compare_reason(a, b)
        data = {"winner": winner, "reason": reason, "a": a.category, "b": b.category}
        return CommandResult(data, f"{a.text} ({a.category}) vs {b.text} ({b.category}): {winner}, by {reason}")

    def census(self, settings: Settings) -> CommandResult:
        re_.load_config(_split_settings(settings)[0])
        counts = rm.census()
        total = sum(counts.values())
        data = {"counts": counts, "total": total, "unit": "amounts 0.01 .. 9.99"}
        lines = [f"{'category':<12}{'amounts':>8}"] + [f"{k:<12}{v:>8}" for k, v in counts.items()]
        return CommandResult(data, "\n".join([*lines, f"{'total':<12}{total:>8}"]))

    def rtp(self, settings: Settings, *, rounds: int | None, seed: int, progress: ProgressFn | None) -> CommandResult:
        game, sim = _split_settings(settings)
        config = re_.load_config(game)
        participants = as_int("sim.participants", sim.get("sim.participants", DEFAULT_PARTICIPANTS), low=2, high=100)
        if participants > config.envelope_total_minor:
            raise ConfigError(
                "sim.participants", f"more participants than minor units in the envelope ({participants})"
            )
        stake = as_int("sim.stake_minor", sim.get("sim.stake_minor", DEFAULT_STAKE_MINOR), low=1, high=10**9)
        raw_pool = sim.get("sim.dealer_pool_minor", "unlimited")
        pool = None if raw_pool == "unlimited" else as_int("sim.dealer_pool_minor", raw_pool, low=0, high=10**15)
        base: dict[str, Any] = {"bet": "player vs dealer", "participants": participants, "stake_minor": stake}
        if rounds is None and participants == 2 and pool is None:
            exact, variance = rm.exact_two_player_moments(config, stake)
            data = {
                **base,
                "rtp": float(exact),
                "rtp_fraction": str(exact),
                "variance": float(variance),
                "method": "exact",
            }
            return CommandResult(data, f"player bet, 2 participants: {_pct(exact)} exact")
        n = DEFAULT_MC_ROUNDS if rounds is None else rounds
        est = rm.simulate(
            np.random.default_rng(seed),
            config,
            participants,
            n,
            stake_minor=stake,
            dealer_pool_minor=pool,
            progress=progress,
        )
        data = {
            **base,
            "rtp": est.rtp,
            "ci95": list(est.ci95),
            "rounds": n,
            "method": "monte_carlo",
            "void_rate": est.void_rate,
            "drink_water_rate": est.drink_water_rate,
            "immune_rate": est.immune_rate,
            "dealer_return": est.dealer_return,
            "house_take": est.house_take,
            "variance": est.variance,
        }
        text = (
            f"player bet, {participants} participants: {_pct(est.rtp)}  "
            f"95% CI [{_pct(est.ci95[0])}, {_pct(est.ci95[1])}]  {n} rounds"
        )
        return CommandResult(data, text)

    def report(self) -> str:
        from bull.analysis.red_envelope_report import render

        return render(REPORT_SEED)


RED_ENVELOPE_BULL = RedEnvelopeAdapter()
