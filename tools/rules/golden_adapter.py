"""``golden_bull`` behind the ``adapter.VariantAdapter`` protocol (text in, results out)."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from bull.analysis import exact as _exact
from bull.analysis import fast, golden_bull_math
from bull.analysis.report import golden_report
from bull.cards import check_distinct, format_cards, parse_cards
from bull.rules import golden_bull as gb
from bull.rules.config import Settings
from tools.rules.adapter import CommandResult, ProgressFn

DEFAULT_MC_ROUNDS = 1_000_000


def fraction_text(value: Fraction) -> str:
    """Exact rationals travel as text ("5", "5/2") so JSON never rounds them."""
    return str(value)


class GoldenBullAdapter:
    variant_id = gb.VARIANT_ID
    title = "Golden Bull"

    def eval(self, cards: Sequence[str], settings: Settings) -> CommandResult:
        config = gb.GoldenBullConfig.from_settings(settings)
        hand = gb.evaluate(parse_cards(" ".join(cards)), config)
        data = self._hand_data(hand, config)
        text = (
            f"{format_cards(hand.cards)}: {hand.category}, points {hand.points}, "
            f"x{data['multiplier']}, high card {hand.high_card}"
        )
        return CommandResult(data, text)

    def compare(self, hand_a: Sequence[str], hand_b: Sequence[str], settings: Settings) -> CommandResult:
        config = gb.GoldenBullConfig.from_settings(settings)
        a = gb.evaluate(parse_cards(" ".join(hand_a)), config)
        b = gb.evaluate(parse_cards(" ".join(hand_b)), config)
        check_distinct([*a.cards, *b.cards])  # the two hands come from one deck
        order = gb.compare(a, b)
        winner = "a" if order > 0 else "b" if order < 0 else "tie"
        reason = gb.explain(a, b, config)
        data = {"winner": winner, "reason": reason, "a": self._hand_data(a, config), "b": self._hand_data(b, config)}
        return CommandResult(data, f"{'A wins' if winner == 'a' else 'B wins' if winner == 'b' else 'tie'}: {reason}")

    def census(self, settings: Settings) -> CommandResult:
        counts = golden_bull_math.census(gb.GoldenBullConfig.from_settings(settings))
        data = {"counts": {str(c): n for c, n in counts.items()}, "total": sum(counts.values())}
        lines = [f"{c:<11} {n:>9}" for c, n in counts.items()]
        return CommandResult(data, "\n".join([*lines, f"{'total':<11} {data['total']:>9}"]))

    def rtp(self, settings: Settings, *, rounds: int | None, seed: int, progress: ProgressFn | None) -> CommandResult:
        config = gb.GoldenBullConfig.from_settings(settings)
        if rounds is None:
            exact = _exact.exact_rtp(config)
            data = {
                "variant": self.variant_id,
                "method": "exact",
                "rtp": float(exact.rtp),
                "rtp_fraction": fraction_text(exact.rtp),
                "variance": float(exact.variance),
                "variance_fraction": fraction_text(exact.variance),
                "win": float(exact.win),
                "tie": float(exact.tie),
                "loss": float(exact.loss),
                "expected_commission": float(exact.expected_commission),
                "pairs": _exact.PAIRS,
                "config": config.to_settings(),
            }
            return CommandResult(data, f"exact RTP {float(exact.rtp):.9%} ({exact.rtp}), every deal counted")
        result = fast.simulate(config, rounds, np.random.default_rng(seed), progress=progress)
        return monte_carlo_result(self.variant_id, result, seed, config.to_settings())

    def report(self) -> str:
        return golden_report()

    @staticmethod
    def _hand_data(hand: gb.GoldenBullHand, config: gb.GoldenBullConfig) -> dict[str, object]:
        return {
            "cards": [card.code for card in hand.cards],
            "category": str(hand.category),
            "points": hand.points,
            "multiplier": fraction_text(config.multiplier(hand.category)),
            "high_card": hand.high_card.code,
            "strength": hand.strength,
        }


def monte_carlo_result(
    variant_id: str, result: fast.MonteCarloResult, seed: int, config: dict[str, str]
) -> CommandResult:
    low, high = result.ci95
    data = {
        "variant": variant_id,
        "method": "monte_carlo",
        "rtp": result.rtp,
        "ci95": [low, high],
        "std_error": result.std_error,
        "variance": result.bet_variance,
        "rounds": result.rounds,
        "seed": seed,
        "config": config,
    }
    text = f"Monte Carlo RTP {result.rtp:.4%} (95% CI {low:.4%} .. {high:.4%}), {result.rounds} rounds, seed {seed}"
    return CommandResult(data, text)


GOLDEN_BULL = GoldenBullAdapter()
