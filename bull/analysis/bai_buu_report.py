"""The Bai Buu math report (``docs/math/bai_buu.md``), rendered by the CLI ``report`` command.

Deterministic: exact figures come from enumeration, the Monte Carlo check from a
fixed seed, and nothing depends on the clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from bull.analysis import bai_buu_math as bm
from bull.rules import bai_buu


def _pct(value: Fraction | float, places: int = 4) -> str:
    return f"{float(value) * 100:.{places}f}%"


def _one_in(count: int, total: int) -> str:
    return f"1 in {total / count:,.1f}" if count else "never"


def _census_tables(groups: Mapping[str, int], hands: Mapping[str, int]) -> list[str]:
    g_total, h_total = sum(groups.values()), sum(hands.values())
    lines = [
        "## 1. Census",
        "",
        f"### Two-card groups ({g_total:,} = C(52,2)), strongest first",
        "",
        "| group | count | probability |",
        "|---|---:|---:|",
    ]
    lines += [f"| `{k}` | {v} | {_pct(Fraction(v, g_total))} |" for k, v in groups.items()]
    lines += [
        f"| total | {g_total:,} | 100% |",
        "",
        "`points_9_5` is 9 + A; `points_10` two different J/Q/K; `points_0` includes one J/Q/K with a 10.",
        "",
        f"### Four-card hands ({h_total:,} = C(52,4) card sets)",
        "",
        "The categories are properties of the set of four cards, so every one of a set's",
        "six head/last splits has the same category (multiply by 6 for ordered splits:",
        f"{6 * h_total:,}). `flush` (four cards of one suit) only matters to the jackpot.",
        "",
        "| category | count | probability | frequency |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| `{k}` | {v:,} | {_pct(Fraction(v, h_total), 5)} | {_one_in(v, h_total) if k != 'plain' else ''} |"
        for k, v in hands.items()
    ]
    lines += [f"| total | {h_total:,} | 100% | |", ""]
    return lines


def _duel_table(counts: bm.DuelCounts) -> list[str]:
    rows = [
        ("banker wins, full prize", counts.banker_full),
        ("banker wins, half prize", counts.banker_half),
        ("tie", counts.tie),
        ("player wins, full prize", counts.player_full),
        ("player wins, half prize", counts.player_half),
    ]
    lines = [
        "## 2. Banker against one player: exact outcome distribution",
        "",
        "Every way to deal the banker's and one player's head and last from one deck,",
        f"C(52,2)·C(50,2)·C(48,2)·C(46,2) = {bm.DUELS_TOTAL:,} deals (the other players'",
        "cards are unseen, so this is exact for each of Player 01, 02 and 03). The",
        "enumeration runs over rank patterns (91 x 91 hand classes per side) weighted by",
        "their number of suit assignments, and checks that the weights add up to the total.",
        "",
        "| outcome | deals | probability |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {n:,} | {_pct(Fraction(n, counts.total), 5)} |" for name, n in rows]
    lines += [f"| total | {counts.total:,} | 100% |", ""]
    return lines


def _rtp_row(label: str, config: bai_buu.BaiBuuConfig, counts: Mapping[int, bm.DuelCounts]) -> str:
    main = bm.main_bet_rtp(config, counts)
    var = bm.main_bet_variance(config, counts)
    return (
        f"| {label} | {_pct(main['banker'])} | {float(var['banker']):.6f} "
        f"| {_pct(main['player'])} | {float(var['player']):.6f} |"
    )


JACKPOT_SCENARIOS: tuple[tuple[str, Mapping[str, object]], ...] = (
    ("default (no seed, floor on, split among winning bets)", {}),
    ("`jackpot.seed_minor=10000` (100.00, reset to it)", {"jackpot.seed_minor": 10_000}),
    (
        "`jackpot.seed_minor=5000`, `jackpot.reset_minor=20000`",
        {"jackpot.seed_minor": 5_000, "jackpot.reset_minor": 20_000},
    ),
    ("`jackpot.four_of_a_kind_floor=false` (an earlier reading)", {"jackpot.four_of_a_kind_floor": "false"}),
    ("`jackpot.pool_share_bps=0` (no progressive part)", {"jackpot.pool_share_bps": 0}),
    ("`jackpot.pool_share_bps=2000`", {"jackpot.pool_share_bps": 2_000}),
    (
        "`jackpot.pay.three_of_a_kind=40`, `jackpot.pay.flush=15`",
        {"jackpot.pay.three_of_a_kind": 40, "jackpot.pay.flush": 15},
    ),
)


def _jackpot_rows(hands: Mapping[str, int]) -> list[str]:
    rows = []
    for label, settings in JACKPOT_SCENARIOS:
        config = bai_buu.load_config(settings)
        for pattern in (4, 1):
            m = bm.jackpot_model(config, hands, pattern)
            rows.append(
                f"| {label} | {pattern} | **{_pct(m.rtp)}** | {m.variance:,.2f} | {_pct(m.pay_table)} "
                f"| {_pct(m.pool)} | {_pct(m.seed)} | {_pct(m.floor, 6)} | {_pct(m.rtp - m.pay_table)} "
                f"| {m.mean_prize:,.2f} |"
            )
    return rows


def render(seed: int, mc_rounds: int) -> str:
    groups, hands = bm.group_census(), bm.hand_census()
    counts = {6: bm.duel_counts(6)}
    default = bai_buu.DEFAULT_CONFIG
    main = bm.main_bet_rtp(default, counts)
    variance = bm.main_bet_variance(default, counts)
    four_hands = bm.jackpot_model(default, hands, 4)
    one_hand = bm.jackpot_model(default, hands, 1)
    half = Fraction(counts[6].banker_half, counts[6].total)
    lines = [
        "# Bai Buu: math report",
        "",
        "Variant id `bai_buu` (seed `002_3e0a4beed1fc2781.txt`). Rules as the project implements",
        "them: [docs/rules/bai_buu.md](../rules/bai_buu.md); code: `bull/rules/bai_buu.py`.",
        "Generated by `python -m tools.rules.reports --write` (all four reports) or",
        "`niuniu-rules report --variant bai_buu`; `tests/rules/test_reports.py` fails when this",
        "file differs from what the code generates. Every figure is reproducible: exact ones by",
        f"enumeration, the jackpot's by a closed-form model, the Monte Carlo check from seed {seed}.",
        "Do not edit by hand.",
        "",
        "Variance is that of one bet's net result per unit staked (a bet of b has variance b^2",
        "times it).",
        "",
        "## Rules as implemented",
        "",
        "- Deal: from the shuffled 52-card deck the banker takes cards 1-4, Player 01",
        "  cards 5-8, Player 02 cards 9-12, Player 03 cards 13-16; in each hand cards 1-2",
        "  are the head and 3-4 the last (no player choice).",
        "- A group: a pair beats any non-pair (pairs 2 < ... < K < A); otherwise points =",
        "  sum mod 10 (J/Q/K = 10, A = 1), 9 + A = 9.5, two different J/Q/K = 10 (top",
        "  non-pair), one J/Q/K with a 10 = 0; equal points tie the group.",
        "- Four of a kind beats any other hand, three of a kind any hand below it; equal",
        "  specials (and two plain hands) are decided by head and last through the seed's",
        "  table (W+W, W+T, T+W win; W+L, L+W, T+T tie; T+L, L+T, L+L lose).",
        "- Bets, with the seed's names: **Banker (01-03)** (`banker_01`..`banker_03`) and",
        "  **Player (01-03)** (`player_01`..`player_03`) at odds 2.0, stake included; tie",
        "  returns the stake; **half prize** (profit x 0.5) when the winning side won its",
        "  head or its last with a non-pair group worth exactly 6 points *(interpretation: a",
        '  pair is never "a total of 6", and a hand won outright by four or three of a kind',
        '  was not won "for head or last", so it is paid in full)*.',
        "- **Jackpot Banker / Jackpot Player (01-03)** (`jackpot_banker`,",
        "  `jackpot_player_01`..`03`): fixed stake 1.00; three of a kind pays 50 for 1 and a",
        "  four-card flush 20 for 1 (the figure includes the stake: +49.00 net, as in the",
        "  seed's example), from the house; four of a kind wins the progressive pool, split",
        "  equally among the winning jackpot bets (`jackpot.split=bets`; equal per bet is pro",
        "  rata to stake, the stake being fixed), and never less than the three-of-a-kind",
        "  prize (`jackpot.four_of_a_kind_floor`, the house pays the difference). 10%",
        "  (`jackpot.pool_share_bps` = 1000) of every jackpot stake feeds the pool, the rest",
        "  goes to the house; this round's contributions join the pool before it pays out. A",
        "  round that pays the pool finds at least `jackpot.seed_minor` in it and leaves it at",
        "  `jackpot.reset_minor` (both 0 by default): the house adds both with `jackpot_seed`",
        "  transfers in that round's settlement.",
        "",
    ]
    lines += _census_tables(groups, hands)
    lines += _duel_table(counts[6])
    lines += [
        "## 3. Return to player and variance, default configuration",
        "",
        "Per unit staked, before rounding of odd stakes (half prizes round down).",
        "",
        "| bet (seed name) | areas | RTP | house edge | variance | method |",
        "|---|---|---:|---:|---:|---|",
        f"| Banker (01-03) | `banker_0k` | {_pct(main['banker'])} | {_pct(1 - main['banker'])} "
        f"| {float(variance['banker']):.6f} | exact |",
        f"| Player (01-03) | `player_0k` | {_pct(main['player'])} | {_pct(1 - main['player'])} "
        f"| {float(variance['player']):.6f} | exact |",
        f"| Jackpot Banker / Jackpot Player (01-03) | `jackpot_*` | {_pct(four_hands.rtp)} "
        f"| {_pct(1 - four_hands.rtp)} | {four_hands.variance:,.2f} | long-run model, a bet on every hand |",
        "",
        "- Banker and Player bets: the game is symmetric, so without the half-prize rule it",
        f"  returns exactly 100%; the rule halves the profit on {_pct(half)} of bets, so",
        f"  RTP = 1 - 0.5 x {_pct(half)} = {_pct(main['player'])} exactly",
        f"  (`{main['player'].numerator}/{main['player'].denominator}`); variance exactly",
        f"  `{variance['player'].numerator}/{variance['player'].denominator}`.",
        f"- Jackpot: the pay table returns {_pct(four_hands.pay_table)} (three of a kind",
        f"  {hands['three_of_a_kind']:,} x 50 + flush {hands['flush']:,} x 20, over {sum(hands.values()):,});",
        f"  the progressive part adds {_pct(four_hands.rtp - four_hands.pay_table)}: the pool's",
        f"  {_pct(four_hands.pool, 2)} (in the long run every contribution is paid back to jackpot",
        f"  bettors) plus the floor's {_pct(four_hands.floor, 6)} (a four of a kind while the pool is",
        "  still below 50.00). A given hand holds four of a kind "
        f"{_one_in(hands['four_of_a_kind'], sum(hands.values()))} rounds;",
        f"  some hand of the four 1 in {1 / four_hands.hit_rate:,.0f}. The mean four-of-a-kind prize is",
        f"  {four_hands.mean_prize:,.2f} per unit staked, which is why the variance is large. With one",
        "  jackpot bet per round instead of four the pool grows four times slower but is hit four",
        f"  times less often: RTP {_pct(one_hand.rtp)}, variance {one_hand.variance:,.2f}.",
        "",
        "## 4. Variations",
        "",
        "### Banker and Player bets (exact)",
        "",
        "| configuration | Banker (0k) RTP | variance | Player (0k) RTP | variance |",
        "|---|---:|---:|---:|---:|",
        _rtp_row("default", default, counts),
        _rtp_row("`half_prize=false`", bai_buu.load_config({"half_prize": "false"}), counts),
        _rtp_row("`odds=1.95`", bai_buu.load_config({"odds": "1.95"}), counts),
        "",
        "### Jackpot bets: the progressive part's contribution to the return",
        "",
        "Long-run model (`bai_buu_math.jackpot_model`): every round has the given number of",
        "jackpot bets, one per hand (4: every hand; 1: one hand only); the pool restarts at the",
        "reset amount after every payout and grows by the contributions until the next (the",
        "seed only tops up the very first pool, which does not count in the long run).",
        "*progressive part* = pool + seed + floor = RTP - pay table. With one bet per hand",
        "`jackpot.split=bets` and `hands` pay the same.",
        "",
        "| configuration | bets per round | RTP | variance | pay table | pool | seed (house) "
        "| floor (house) | progressive part | mean 4-of-a-kind prize |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *_jackpot_rows(hands),
        "",
        "- The seed and reset amounts are house money: each payout is followed by the reset",
        "  funding, so they add reset x (payouts per round) / (jackpot bets per round) to the",
        "  return, the same for either betting pattern.",
        "- The floor (a four of a kind pays at least the three-of-a-kind prize) costs the house",
        "  almost nothing in the long run (the pool is rarely below 50.00 when hit), but it is",
        "  what a bettor sees on a fresh, unseeded pool: +49.00 instead of -0.90 on an empty pool.",
        "- `jackpot.split=hands` (an earlier reading) only differs when a hand holding",
        "  four of a kind has no jackpot bet: its share then stays in the pool for later rounds,",
        "  which moves money between bettors but not, in the long run, the return.",
        "",
    ]
    mc = bm.monte_carlo(default, mc_rounds, seed)
    lines += [
        "## 5. Monte Carlo cross-check",
        "",
        f"{mc_rounds:,} rounds dealt by `bai_buu.deal` from `numpy.random.default_rng({seed})`",
        "permutations and settled by `bai_buu.settle` with one bet on every area (stake",
        "100.00; jackpot 1.00) and the pool starting empty. The interval is a 95% normal",
        "interval over rounds; the jackpot's is only indicative (its pool carries over, and",
        "this many rounds rarely see a four of a kind). A smoke check of the settlement code",
        "against the exact figures, kept small so that regenerating the report stays fast.",
        "",
        "| bet | exact | Monte Carlo | 95% CI |",
        "|---|---:|---:|---:|",
    ]
    exact = {"banker": main["banker"], "player": main["player"], "jackpot": Fraction(four_hands.rtp)}
    names = {"banker": "Banker (01-03)", "player": "Player (01-03)", "jackpot": "Jackpot (long-run model)"}
    for kind, name in names.items():
        low, high = mc.ci95[kind]
        lines.append(f"| {name} | {_pct(exact[kind])} | {_pct(mc.rtp[kind])} | [{_pct(low)}, {_pct(high)}] |")
    lines += [
        "",
        f"Rounds with a four of a kind: {mc.four_of_a_kind_rounds}; pool at the end: {mc.pool_end_minor / 100:,.2f}.",
        "",
        "## Seed examples",
        "",
        "Every settlement line of the seed's two example rounds is reproduced by",
        "`tests/rules/test_bai_buu.py`. The second example's result column says",
        '"Banker(03)" while its Player 03 bet is shown winning +100; the tests follow the',
        "settlement lines (Player 03 beats the banker) and note the contradiction.",
        "",
    ]
    return "\n".join(lines)
