"""The ``bai_buu`` adapter for the ``niuniu-rules`` CLI and the math report.

Translates card codes and ``key=value`` settings to :mod:`bai_buu` calls and
its results to ``CommandResult`` values; never prints, exits or draws ambient
randomness (Monte Carlo runs take their seed as an argument).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from bull.analysis import bai_buu_math as bm
from bull.cards import Card, format_cards, parse_cards
from bull.rules import bai_buu
from bull.rules.config import Settings
from tools.rules.adapter import CommandResult, ProgressFn

DEFAULT_MC_ROUNDS = 50_000
REPORT_SEED = 20_240_602
REPORT_MC_ROUNDS = 4_000


def _hand(cards: Sequence[str]) -> bai_buu.Hand:
    parsed: tuple[Card, ...] = parse_cards(" ".join(cards), size=bai_buu.HAND_SIZE)
    return bai_buu.make_hand(parsed)


def _points_text(group: bai_buu.Group) -> str:
    if group.is_pair:
        return "pair of " + "A23456789TJQKA"[group.pair_rank - 1]
    whole, half = divmod(group.points_x2, 2)
    return f"{whole}.5 points" if half else f"{whole} points"


def _pct(value: Fraction | float) -> str:
    return f"{float(value) * 100:.4f}%"


class BaiBuuAdapter:
    """Implements ``adapter.VariantAdapter`` for ``bai_buu``."""

    @property
    def variant_id(self) -> str:
        return bai_buu.VARIANT_ID

    @property
    def title(self) -> str:
        return "Bai Buu"

    def eval(self, cards: Sequence[str], settings: Settings) -> CommandResult:
        config = bai_buu.load_config(settings)
        hand = _hand(cards)
        data = {
            "cards": format_cards(hand.cards),
            "category": hand.category,
            "points": f"head {_points_text(hand.head)}, last {_points_text(hand.last)}",
            "head": hand.head.category,
            "last": hand.last.category,
            "jackpot": hand.jackpot,
            # Bai Buu hands carry no multiplier of their own: every main bet pays ``odds``.
            "multiplier": float(config.odds),
        }
        jackpot = f"; jackpot: {hand.jackpot.replace('_', ' ')}" if hand.jackpot else ""
        text = f"{data['cards']}: {hand.category.replace('_', ' ')}, {data['points']}{jackpot}"
        return CommandResult(data, text)

    def compare(self, hand_a: Sequence[str], hand_b: Sequence[str], settings: Settings) -> CommandResult:
        config = bai_buu.load_config(settings)
        a, b = _hand(hand_a), _hand(hand_b)
        bai_buu.check_distinct_hands(a, b)
        d = bai_buu.duel(a, b, config)
        winner = {1: "a", 0: "tie", -1: "b"}[d.result]
        data = {
            "winner": winner,
            "reason": d.reason,
            "head": d.head,
            "last": d.last,
            "decided_by": d.decided_by,
            "half_prize": d.half_prize,
        }
        text = f"{format_cards(a.cards)} vs {format_cards(b.cards)}: {winner} ({d.reason})"
        return CommandResult(data, text)

    def census(self, settings: Settings) -> CommandResult:
        bai_buu.load_config(settings)
        hands = bm.hand_census()
        groups = bm.group_census()
        data: dict[str, Any] = {
            "counts": hands,
            "total": sum(hands.values()),
            "unit": "four-card hands (sets; each has 6 head/last splits)",
            "groups": {"counts": groups, "total": sum(groups.values())},
        }
        lines = [f"{'category':<18}{'hands':>10}"] + [f"{k:<18}{v:>10}" for k, v in hands.items()]
        lines += [f"{'total':<18}{data['total']:>10}", "", f"{'group':<18}{'groups':>10}"]
        lines += [f"{k:<18}{v:>10}" for k, v in groups.items()] + [f"{'total':<18}{sum(groups.values()):>10}"]
        return CommandResult(data, "\n".join(lines))

    def rtp(self, settings: Settings, *, rounds: int | None, seed: int, progress: ProgressFn | None) -> CommandResult:
        """``banker_0k``, ``player_0k`` and jackpot returns; ``data["rtp"]`` is ``player_0k``'s."""
        config = bai_buu.load_config(settings)
        if rounds is None:
            counts = {config.half_prize_points: bm.duel_counts(config.half_prize_points, progress=progress)}
            main = bm.main_bet_rtp(config, counts)
            variance = bm.main_bet_variance(config, counts)
            model = bm.jackpot_model(config, bm.hand_census(), 4)
            bets: dict[str, dict[str, Any]] = {
                f"{side}_0k": {
                    "rtp": float(main[side]),
                    "rtp_fraction": str(main[side]),
                    "variance": float(variance[side]),
                    "variance_fraction": str(variance[side]),
                }
                for side in ("banker", "player")
            }
            bets["jackpot"] = {
                "rtp": model.rtp,
                "variance": model.variance,
                "method": "long-run model, a jackpot bet on every hand every round",
                "pay_table": model.pay_table,
                "pool_long_run": model.pool,
                "house_seed": model.seed,
                "house_floor": model.floor,
            }
            data: dict[str, Any] = {
                "rtp": float(main["player"]),
                "rtp_fraction": str(main["player"]),
                "method": "exact",
                "bet": "player_0k",
                "bets": bets,
            }
            text = "\n".join(
                f"{name:<10} {_pct(bet['rtp'])}  variance {bet['variance']:.6f}  "
                + ("exact" if "rtp_fraction" in bet else "long-run model")
                for name, bet in bets.items()
            )
            return CommandResult(data, text)
        mc = bm.monte_carlo(config, rounds, seed, progress=progress)
        names = {"banker": "banker_0k", "player": "player_0k", "jackpot": "jackpot"}
        bets = {names[k]: {"rtp": mc.rtp[k], "ci95": list(mc.ci95[k])} for k in mc.rtp}
        data = {
            "rtp": mc.rtp["player"],
            "ci95": list(mc.ci95["player"]),
            "rounds": rounds,
            "method": "monte_carlo",
            "bet": "player_0k",
            "bets": bets,
        }
        text = "\n".join(
            f"{names[k]:<10} {_pct(mc.rtp[k])}  95% CI [{_pct(mc.ci95[k][0])}, {_pct(mc.ci95[k][1])}]  {rounds} rounds"
            for k in mc.rtp
        )
        return CommandResult(data, text)

    def report(self) -> str:
        from bull.analysis.bai_buu_report import render

        return render(REPORT_SEED, REPORT_MC_ROUNDS)


BAI_BUU = BaiBuuAdapter()
