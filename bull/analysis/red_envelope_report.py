"""The red-envelope bull math report (``docs/math/red_envelope_bull.md``), rendered by the CLI.

Deterministic: the census and the two-participant figure are exact, every
Monte Carlo row has its own fixed seed, and nothing depends on the clock.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from bull.analysis import red_envelope_math as rm
from bull.rules import red_envelope as re_

MAIN_ROUNDS = 100_000
VARIATION_ROUNDS = 40_000
STAKE_MINOR = 1000
PARTICIPANT_COUNTS = (2, 3, 5, 10)
VARIATION_PARTICIPANTS = 5


def _pct(value: Fraction | float, places: int = 2) -> str:
    return f"{float(value) * 100:.{places}f}%"


def _census(config: re_.RedEnvelopeConfig) -> list[str]:
    counts = rm.census()
    total = sum(counts.values())
    lines = [
        f"## 1. Census: every amount 0.01 .. 9.99 ({total} amounts)",
        "",
        "| category | multiplier | amounts | share |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| `{k}` {re_.CATEGORY_NAMES[k]} | x{config.multiplier(k)} | {v} | {_pct(Fraction(v, total))} |"
        for k, v in counts.items()
    ]
    lines += [
        f"| total | | {total} | 100% |",
        "",
        "Derivation of the special counts (checked independently by the tests): baozi 1.11 ..",
        "9.99 (9); manniu 1.00 .. 9.00 (9); fanshun 2.10 .. 9.87 (8); shunzi 0.12 .. 7.89 (8);",
        "duizi: 99 amounts whose last two digits are equal, less the 9 baozi and the 9 manniu",
        "(81); jinniu 0.10 .. 0.90 (9). An amount meeting several definitions takes the",
        "strongest (3.00 is manniu, not duizi; 1.11 is baozi).",
        "",
    ]
    return lines


def _row(label: str, est: rm.Estimate) -> str:
    low, high = est.ci95
    return (
        f"| {label} | {_pct(est.rtp)} | [{_pct(low)}, {_pct(high)}] | {est.variance:.3f} | {_pct(est.void_rate, 3)} "
        f"| {_pct(est.immune_rate, 3)} | {_pct(est.drink_water_rate, 3)} | {_pct(est.dealer_return)} "
        f"| {_pct(est.house_take)} |"
    )


_TABLE_HEAD = [
    "| case | player RTP | 95% CI | variance | void rounds | 免死 bets | 喝水 bets | dealer return | house take |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
]


def _exact_two(config: re_.RedEnvelopeConfig) -> tuple[Fraction, Fraction, Fraction]:
    """(player RTP, variance of the player's net, dealer's return), per unit staked, two participants."""
    rtp, variance = rm.exact_two_player_moments(config, STAKE_MINOR)
    total = config.envelope_total_minor
    amounts = np.array([[d, total - d] for d in range(2, total)], dtype=np.int64)
    dealer = rm.settle_vectorised(amounts, STAKE_MINOR, None, config).dealer_net
    return rtp, variance, Fraction(int(dealer.sum()), STAKE_MINOR * len(amounts))


DRINK_WATER_POOLS = ((None, "unlimited"), (30_000, "300.00"), (10_000, "100.00"), (5_000, "50.00"))


def _drink_water_section(seed: int) -> list[str]:
    lines = [
        f"## 5. 喝水: what the dealer-pool cap costs ({VARIATION_PARTICIPANTS} participants, "
        f"{VARIATION_ROUNDS:,} envelopes each)",
        "",
        "Every row uses the same envelopes (one seed), so the differences between rows are the",
        "rules' effect, not sampling noise. *Cost to players* is the drop of the player's RTP",
        "from the unlimited-pool row; every player stakes 10.00 against a pool of the size shown.",
        "`drink_water_base` is what each loser adds to the budget: `stakes` (default) or `paid`.",
        "",
        "| `drink_water_base` | `drink_water` | dealer pool | player RTP | variance | 喝水 bets "
        "| dealer return | cost to players |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    unlimited: float | None = None
    for base in re_.DRINK_WATER_BASES:
        for rule in re_.DRINK_WATER_RULES:
            config = re_.load_config({"drink_water": rule, "drink_water_base": base})
            for pool, label in DRINK_WATER_POOLS:
                if pool is None and unlimited is not None:
                    continue  # with an unlimited pool nobody drinks water: the same row for every rule
                est = rm.simulate(
                    np.random.default_rng(seed + 99),
                    config,
                    VARIATION_PARTICIPANTS,
                    VARIATION_ROUNDS,
                    stake_minor=STAKE_MINOR,
                    dealer_pool_minor=pool,
                )
                if pool is None:
                    unlimited = est.rtp
                cost = (est.rtp if unlimited is None else unlimited) - est.rtp
                names = ("any", "any") if pool is None else (f"`{base}`", f"`{rule}`")
                lines.append(
                    f"| {names[0]} | {names[1]} | {label} | {_pct(est.rtp)} | {est.variance:.3f} "
                    f"| {_pct(est.drink_water_rate, 3)} | {_pct(est.dealer_return)} | {_pct(cost)} |"
                )
    lines += [
        "",
        "- `drink_water_base=stakes` (default, the seed's words: the dealer pool plus the",
        "  losers' stakes): each loser adds its stake to the budget, never more than the",
        "  dealer keeps of its payment after commission, so the dealer never pays out more",
        "  than the pool. `paid` *(interpretation)* adds all the dealer keeps of what each",
        "  loser paid (stake x the dealer's multiplier, net of commission): a larger budget,",
        "  fewer winners drink water, a higher player return.",
        "- `stop` (default, the seed's words): winners are paid strongest first while the rest",
        "  of the budget covers a full payment;",
        "  from the first winner it cannot cover on, every winner drinks water (stake back),",
        "  even a weaker winner the rest would cover. A winner owed 180.00 against 179.99 gets",
        "  nothing.",
        "- `skip`: the winner the rest cannot cover drinks water, but weaker winners it still",
        "  covers are paid.",
        "- `partial`: the first winner the rest cannot cover is paid what is left (commission on",
        "  what it gets, and the rebate, as for a win); every weaker winner drinks water.",
        "- A player who drinks water gives up a win worth stake x (1 .. 18) while every loss",
        "  still costs stake x the dealer's multiplier, so the cost grows fast as the pool",
        "  shrinks against the stakes: with four 10.00 bets against a 100.00 pool the players",
        "  lose about twice their stakes on average. `partial` pays out the whole budget and",
        "  costs players least, `skip` next; operators should size the minimum dealer pool",
        "  (the bid) against the table's stake limits with this table in mind.",
        "",
    ]
    return lines


def render(seed: int) -> str:
    default = re_.DEFAULT_CONFIG
    exact, exact_var, exact_dealer = _exact_two(default)
    win_base = re_.load_config({"commission.dealer_base": "win"})
    exact_win, exact_win_var, exact_win_dealer = _exact_two(win_base)
    gross_config = re_.load_config({"commission.dealer_bps": 0, "commission.player_bps": 0, "rebate_bps": 0})
    exact_gross = rm.exact_two_player_rtp(gross_config, STAKE_MINOR)
    lines = [
        "# 68 NiuNiu (red-envelope bull): math report",
        "",
        "Variant id `red_envelope_bull` (seed `003_134c08a6400ee6a2.txt`). Rules as the project",
        "implements them: [docs/rules/red_envelope_bull.md](../rules/red_envelope_bull.md); code:",
        "`bull/rules/red_envelope.py`. Generated by `python -m tools.rules.reports --write` (all",
        "four reports) or `niuniu-rules report --variant red_envelope_bull`;",
        "`tests/rules/test_reports.py` fails when this file differs from what the code generates.",
        "Exact figures by enumeration, Monte Carlo rows from",
        f"`numpy.random.default_rng({seed} + k)` (k as stated per table). Do not edit by hand.",
        "",
        "Variance is that of one player bet's net result per unit staked (a bet of b has variance",
        "b^2 times it); the bets of one envelope are correlated through the dealer's share.",
        "",
        "## Rules as implemented",
        "",
        "- A hand is the grabbed amount written with two decimals; its digits are all the",
        '  digits shown (0.50 -> 0 5 0). "Three digits" are the amounts below 10.00; 10.00',
        "  and more use all their digits *(interpretation)*.",
        "- Points: the last digit of the digit sum, 0 counting as 10 (Niu Niu): RM3.42 is 9.",
        "- Special types, strongest first: baozi x18 (all digits equal), manniu x15 (whole",
        "  amount), fanshun x14 (digits falling by 1: 2.10), shunzi x13 (rising by 1: 0.12),",
        "  duizi x12 (last two digits equal), jinniu x11 (first and last digit 0: 0.50);",
        "  ordinary hands pay their points (x1 .. x10).",
        "- Comparison: type, then points, then amount; two duizi compare the last-two-digit",
        "  number first (0.88 beats 1.66). Equal amounts tie.",
        "- Settlement: a winning player gets stake x own multiplier, a losing one pays stake x",
        "  the dealer's multiplier (hold: stake x 18). The dealer pays winners, strongest",
        "  first, from the pool plus the losers' stakes (`drink_water_base=stakes`, the seed's",
        "  words; a stake counts no more than the dealer keeps of that loser's payment, so",
        "  the dealer never loses more than the pool; `paid`, an interpretation, counts all the",
        "  dealer keeps of what the losers paid) while the rest covers a full payment; the",
        "  remaining winners drink water (喝水, stake back; `drink_water` and",
        "  `drink_water_base`, section 5). Dealer grabs 0.01: the round is void and re-dealt.",
        "  Player grabs 0.01: 免死, a loss becomes a tie (0.01 is the weakest amount, so it",
        "  can never win).",
        "- Fees (defaults from the seed): 5% of the loser's stake when the dealer wins it",
        "  (`commission.dealer_base=stake`, the seed's words; `win` takes 5% of stake x the",
        "  dealer's multiplier instead, section 4) and 5% of a player's winnings to",
        "  `commission_revenue`; 0.7% of the stake back to every bet",
        "  settled as a plain win or loss from `rebate_expense`; the dealer fee, service fee",
        "  and envelope fee are configured amounts (the seed gives none: default 0) paid by",
        "  the dealer to `fees`. Rounding is toward the house (what a participant keeps is",
        "  rounded down) and every fraction is recorded in `Settlement.remainders`.",
        "",
    ]
    lines += _census(default)
    lines += [
        "## 2. Envelope model",
        "",
        f"The system envelope holds {default.envelope_total_minor / 100:.2f} (`envelope.total_minor` =",
        f"{default.envelope_total_minor}, an interpretation: the seed gives no amount) split into one",
        "share per participant (dealer + bettors) by the double-mean method: each draw is",
        "uniform on 0.01 .. min(2 x remaining mean, what leaves 0.01 for everyone after),",
        "the last share takes the rest, and the shares go to participants in random grab",
        "order. Production splits are made by the rng service",
        "(`bull.fairness.split_envelope`, provably fair); the report uses a local",
        "vectorised copy of the same distribution (`red_envelope_math.double_mean_split`).",
        "Every player stakes 10.00 (`sim.stake_minor` = 1000, so the 0.7% rebate is a whole",
        "number of cents) and, unless stated, the dealer pool is large enough that nobody",
        "drinks water.",
        "",
        "RTP is the player's mean return per unit staked (stake back included), over rounds",
        "that are not voided (a void round is re-dealt). Because payments are stake x",
        "multiplier (x1 .. x18) on both sides, the player-side commission (5% of what a",
        "winner is paid, stake x its multiplier) costs a winner far more than 5% of the stake;",
        "the dealer-side commission is 5% of each loser's stake by default",
        "(`commission.dealer_base=stake`).",
        '"Dealer return" is the dealer\'s mean net per unit of the stakes against him;',
        '"house take" = commission + fees - rebates, per unit staked.',
        "",
        "## 3. Return to player, default configuration",
        "",
        "Exact, two participants (dealer and one player; the dealer's share is uniform on",
        f"0.01 .. {(default.envelope_total_minor - 1) / 100:.2f}):",
        "",
        "| `commission.dealer_base` | player RTP | variance | dealer return |",
        "|---|---:|---:|---:|",
        f"| `stake` (default) | **{_pct(exact, 4)}** (`{exact.numerator}/{exact.denominator}`) "
        f"| **{float(exact_var):.4f}** | {_pct(exact_dealer, 4)} |",
        f"| `win` | {_pct(exact_win, 4)} | {float(exact_win_var):.4f} | {_pct(exact_win_dealer, 4)} |",
        "",
        "The dealer-side commission is paid by the dealer, so its base moves the dealer's return",
        "(per unit of the stakes against the dealer), not the player's. With commission and",
        "rebate set to 0 the player's return is",
        f"{_pct(exact_gross, 4)}. That is no accident: with an unlimited pool and no commission",
        "or rebate the return is exactly 100% for any number of participants. The grab",
        "order is uniformly random, so of any two shares each is equally likely to be the",
        "dealer's, and the two settlements cancel; the 0.01 rules cancel the same way (a",
        "dealer's 0.01 voids exactly the win that the other share would have lost as a",
        "player's 免死). The player's shortfall below 100% is therefore the commission less",
        "the rebate, plus whatever 喝水 costs when the pool is short.",
        "",
        *_TABLE_HEAD,
    ]
    for row, n in enumerate(PARTICIPANT_COUNTS):
        est = rm.simulate(np.random.default_rng(seed + row), default, n, MAIN_ROUNDS, stake_minor=STAKE_MINOR)
        lines.append(_row(f"{n} participants ({n - 1} player{'s' if n > 2 else ''})", est))
    lines += [
        "",
        f"Monte Carlo, {MAIN_ROUNDS:,} envelopes per row. Each envelope is settled once with",
        "each share as the dealer's (an unbiased average over the random grab order that",
        "cancels the symmetric part of the game within the envelope); the interval is a",
        "95% delta-method interval for the ratio of player net to live stakes over envelopes.",
        "The two-participant row checks the simulator against the exact figure above.",
        "",
        f"## 4. Variations ({VARIATION_PARTICIPANTS} participants, {VARIATION_ROUNDS:,} envelopes each)",
        "",
        *_TABLE_HEAD,
    ]
    variations: list[tuple[str, re_.RedEnvelopeConfig, int | None]] = [
        ("default (`commission.dealer_base=stake`)", default, None),
        ("`commission.dealer_base=win`", win_base, None),
        ("no commission, no rebate", gross_config, None),
        ("`commission.player_bps=0` (dealer commission only)", re_.load_config({"commission.player_bps": 0}), None),
        ("`envelope.total_minor=500` (5.00)", re_.load_config({"envelope.total_minor": 500}), None),
        ("`envelope.total_minor=2000` (20.00)", re_.load_config({"envelope.total_minor": 2000}), None),
        ("dealer pool 300.00", default, 30_000),
        ("dealer pool 100.00", default, 10_000),
        (
            "fees 1.00 each (dealer, service, envelope)",
            re_.load_config({"fees.dealer_minor": 100, "fees.service_minor": 100, "fees.envelope_minor": 100}),
            None,
        ),
    ]
    for label, config, pool in variations:
        est = rm.simulate(
            np.random.default_rng(seed + len(PARTICIPANT_COUNTS)),  # the same envelopes for every variation
            config,
            VARIATION_PARTICIPANTS,
            VARIATION_ROUNDS,
            stake_minor=STAKE_MINOR,
            dealer_pool_minor=pool,
        )
        lines.append(_row(label, est))
    lines += [
        "",
        f"All variations share their envelopes (seed {seed} + {len(PARTICIPANT_COUNTS)}), so their",
        "differences are the configuration's effect. The no-fee row's interval has zero width",
        "because every envelope's settlements cancel exactly (section 3); dealer commission",
        "alone leaves the player exactly the 0.7% rebate above 100%. The dealer-side",
        "commission base moves only the dealer's return.",
        "",
        "Fees are paid by the dealer, so they move the dealer's return and the house take,",
        "never the player's. A small dealer pool makes winners drink water, which lowers the",
        "player's return and raises the dealer's; it can go below zero because a loss costs",
        "stake x the dealer's multiplier while a winner who drinks water gets only the stake",
        f"back. Section 5 compares the three `drink_water` rules (seed {seed} + 99).",
        "",
    ]
    lines += _drink_water_section(seed)
    return "\n".join(lines)
