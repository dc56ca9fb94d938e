"""``baibian_bull`` behind the ``adapter.VariantAdapter`` protocol (text in, results out)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bull.analysis import baibian_bull_math, fast
from bull.analysis.report import baibian_report
from bull.cards import check_distinct, format_cards, parse_cards
from bull.rules import baibian_bull as bb
from bull.rules.config import Settings
from tools.rules.adapter import CommandResult, ProgressFn
from tools.rules.golden_adapter import fraction_text, monte_carlo_result

DEFAULT_MC_ROUNDS = 1_000_000


class BaibianBullAdapter:
    variant_id = bb.VARIANT_ID
    title = "Hundred-player Bull with jokers (百變牛牛)"

    def eval(self, cards: Sequence[str], settings: Settings) -> CommandResult:
        config = bb.BaibianBullConfig.from_settings(settings)
        hand = bb.evaluate(parse_cards(" ".join(cards)), config)
        data = self._hand_data(hand, config)
        text = f"{format_cards(hand.cards)}: {hand.category}, x{data['multiplier']}, high card {hand.high_card}"
        return CommandResult(data, text)

    def compare(self, hand_a: Sequence[str], hand_b: Sequence[str], settings: Settings) -> CommandResult:
        config = bb.BaibianBullConfig.from_settings(settings)
        a = bb.evaluate(parse_cards(" ".join(hand_a)), config)
        b = bb.evaluate(parse_cards(" ".join(hand_b)), config)
        check_distinct([*a.cards, *b.cards])  # the two hands come from one deck
        order = bb.compare(a, b)
        winner = "a" if order > 0 else "b" if order < 0 else "tie"
        reason = bb.explain(a, b)
        data = {"winner": winner, "reason": reason, "a": self._hand_data(a, config), "b": self._hand_data(b, config)}
        return CommandResult(data, f"{'A wins' if winner == 'a' else 'B wins' if winner == 'b' else 'tie'}: {reason}")

    def census(self, settings: Settings) -> CommandResult:
        bb.BaibianBullConfig.from_settings(settings)  # validates; categories do not depend on it
        counts = baibian_bull_math.census()
        data = {"counts": {str(c): n for c, n in counts.items()}, "total": sum(counts.values())}
        lines = [f"{c:<10} {n:>9}" for c, n in counts.items()]
        return CommandResult(data, "\n".join([*lines, f"{'total':<10} {data['total']:>9}"]))

    def rtp(self, settings: Settings, *, rounds: int | None, seed: int, progress: ProgressFn | None) -> CommandResult:
        config = bb.BaibianBullConfig.from_settings(settings)
        count = DEFAULT_MC_ROUNDS if rounds is None else rounds
        result = fast.simulate_baibian(config, count, np.random.default_rng(seed), progress=progress)
        return monte_carlo_result(self.variant_id, result, seed, config.to_settings())

    def report(self) -> str:
        return baibian_report()

    @staticmethod
    def _hand_data(hand: bb.BaibianHand, config: bb.BaibianBullConfig) -> dict[str, object]:
        return {
            "cards": [card.code for card in hand.cards],
            "category": str(hand.category),
            "points": _points(hand.category),
            "multiplier": fraction_text(config.multiplier(hand.category)),
            "high_card": hand.high_card.code,
            "strength": hand.strength,
        }


def _points(category: bb.Category) -> int:
    """Bull points of the category: 10 for Bull Bull and the specials above it, 0 for no bull."""
    if category.startswith("bull_") and category is not bb.Category.BULL_BULL:
        return int(category.removeprefix("bull_"))
    return 0 if category is bb.Category.NO_BULL else 10


BAIBIAN_BULL = BaibianBullAdapter()
