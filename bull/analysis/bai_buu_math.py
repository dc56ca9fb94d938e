"""Bai Buu math for the census and the report: exact enumeration and a Monte Carlo check.

Not part of a round (it imports numpy and is only used by the CLI adapter and the
math report). The exact return of the ``banker_0k``/``player_0k`` bets enumerates
every way to deal a banker hand and one player hand (head and last groups), by
rank pattern with suit multiplicities, so it is the exact figure for any of the
three player seats (each sees eight cards drawn from one deck, the other two
players' cards unseen).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from bull import money
from bull.cards import DECK_52, Card
from bull.rules import bai_buu

ProgressFn = Callable[[int, int], None]
Z95 = 1.959963984540054

GROUPS_TOTAL = math.comb(52, 2)
HANDS_TOTAL = math.comb(52, 4)
# (banker head, banker last, player head, player last) as disjoint two-card sets.
DUELS_TOTAL = math.comb(52, 2) * math.comb(50, 2) * math.comb(48, 2) * math.comb(46, 2)


# ---------------------------------------------------------------------------
# Census


def group_census() -> dict[str, int]:
    """Every two-card group (1 326) by ``bai_buu.GROUP_CATEGORIES``."""
    counts = Counter(bai_buu.make_group(a, b).category for a, b in itertools.combinations(DECK_52, 2))
    return {category: counts.get(category, 0) for category in bai_buu.GROUP_CATEGORIES}


def hand_census() -> dict[str, int]:
    """Every four-card hand as a set of cards (270 725) by ``bai_buu.HAND_CATEGORIES``.

    The categories are properties of the set, so each of a set's six head/last
    splits has the same category: multiply by 6 for ordered splits. Counted over
    the rank multisets with their suit choices (prod C(4, n_r)); four distinct
    ranks are a flush in 4 of their 4^4 suit choices. The tests check it against
    every hand.
    """
    counts: Counter[str] = Counter()
    for ranks in itertools.combinations_with_replacement(range(1, 14), 4):
        ways = math.prod(math.comb(4, ranks.count(rank)) for rank in set(ranks))
        special = bai_buu.special_of(ranks)
        if special is bai_buu.Special.FOUR_OF_A_KIND:
            counts["four_of_a_kind"] += ways
        elif special is bai_buu.Special.THREE_OF_A_KIND:
            counts["three_of_a_kind"] += ways
        elif len(set(ranks)) == 4:
            counts["flush"] += 4
            counts["plain"] += ways - 4
        else:
            counts["plain"] += ways
    return {category: counts.get(category, 0) for category in bai_buu.HAND_CATEGORIES}


def hand_census_by_enumeration() -> dict[str, int]:
    """:func:`hand_census` the slow way, over all 270 725 sets (for the tests)."""
    counts: Counter[str] = Counter()
    for cards in itertools.combinations(DECK_52, 4):
        counts[_set_category(cards)] += 1
    return {category: counts.get(category, 0) for category in bai_buu.HAND_CATEGORIES}


def _set_category(cards: tuple[Card, ...]) -> str:
    special = bai_buu.special_of([card.rank for card in cards])
    if special is bai_buu.Special.FOUR_OF_A_KIND:
        return "four_of_a_kind"
    if special is bai_buu.Special.THREE_OF_A_KIND:
        return "three_of_a_kind"
    return "flush" if len({card.suit for card in cards}) == 1 else "plain"


# ---------------------------------------------------------------------------
# Exact duel enumeration


@dataclass(frozen=True, slots=True)
class DuelCounts:
    """Weighted counts of (banker hand, player hand) deals, out of ``DUELS_TOTAL``."""

    banker_full: int
    banker_half: int
    tie: int
    player_full: int
    player_half: int

    @property
    def total(self) -> int:
        return self.banker_full + self.banker_half + self.tie + self.player_full + self.player_half

    def rtp(self, side: str, odds: Fraction) -> Fraction:
        """Exact return per unit staked on ``side`` ("banker" or "player"), before rounding."""
        full, half = (self.banker_full, self.banker_half) if side == "banker" else (self.player_full, self.player_half)
        half_return = 1 + (odds - 1) / 2
        return (odds * full + half_return * half + self.tie) / self.total

    def variance(self, side: str, odds: Fraction) -> Fraction:
        """Exact variance of the net result per unit staked on ``side`` (loss -1, tie 0, win odds - 1 or half)."""
        full, half = (self.banker_full, self.banker_half) if side == "banker" else (self.player_full, self.player_half)
        lost = self.total - full - half - self.tie
        profit = odds - 1
        second = (full * profit**2 + half * (profit / 2) ** 2 + lost) / self.total
        mean = self.rtp(side, odds) - 1
        return second - mean * mean


def _ratio_table() -> npt.NDArray[np.int64]:
    """``R[a, b]`` = ways to give ``a`` more cards of a rank of which ``b`` are already dealt.

    With four suits that is 4!/(4-b)! extended by ``a`` more: (4-b)(4-b-1)... (``a`` factors).
    """
    table = np.zeros((9, 9), dtype=np.int64)
    for a in range(9):
        for b in range(9):
            table[a, b] = math.perm(4 - b, a) if a + b <= 4 else 0
    return table


def _hand_classes(half_prize_points: int) -> dict[str, npt.NDArray[np.int64]]:
    """Every hand as (head rank pair, last rank pair): 91 x 91 classes and their properties."""
    pairs = [(a, b) for a in range(1, 14) for b in range(a, 14)]
    strength, six, is_pair = [], [], []
    for a, b in pairs:
        if a == b:
            strength.append(bai_buu.PAIR_BASE + bai_buu.pair_order(a))
            six.append(False)
        else:
            x2 = bai_buu.group_points_x2(a, b)
            strength.append(x2)
            six.append(x2 == 2 * half_prize_points)
        is_pair.append(a == b)
    n = len(pairs)
    head = np.repeat(np.arange(n), n)
    last = np.tile(np.arange(n), n)
    # Rank counts, with a 14th always-empty column used to pad the rank lists below.
    counts = np.zeros((n * n, 14), dtype=np.int64)
    for groups in (head, last):
        for side in (0, 1):
            ranks = np.array([p[side] for p in pairs])[groups] - 1
            np.add.at(counts, (np.arange(n * n), ranks), 1)
    # Each hand's (up to four) distinct ranks and their counts, padded with the empty column.
    order = np.argsort(-counts[:, :13], axis=1, kind="stable")[:, :4]
    own_counts = np.take_along_axis(counts, order, axis=1)
    own_ranks = np.where(own_counts > 0, order, 13)
    falling = np.array([math.perm(4, c) for c in range(5)], dtype=np.int64)
    strength_a, six_a, pair_a = np.array(strength), np.array(six), np.array(is_pair)
    top = counts.max(axis=1)
    return {
        "head": strength_a[head],
        "last": strength_a[last],
        "head_six": six_a[head].astype(np.int64),
        "last_six": six_a[last].astype(np.int64),
        "special": np.where(top == 4, 2, np.where(top == 3, 1, 0)),
        "counts": counts,
        "own_ranks": own_ranks,
        "own_counts": own_counts,
        "suits": falling[counts[:, :13]].prod(axis=1),  # suit assignments of the hand alone
        "divisor": np.where(pair_a[head], 2, 1) * np.where(pair_a[last], 2, 1),
    }


_OUTCOMES = ("banker_full", "banker_half", "tie", "player_half", "player_full")


def duel_counts(half_prize_points: int = 6, *, progress: ProgressFn | None = None, block: int = 128) -> DuelCounts:
    """Exact weighted outcome counts of banker vs one player (91^4, about 69 million class pairs).

    The weight of a (banker class, player class) pair is the number of ways to give
    its cards suits from one deck: the player's own suit assignments times, for each
    rank of the banker, the ways to add the banker's cards of that rank, divided by
    2 for every pair group (its two cards are a set, not a sequence).
    """
    h = _hand_classes(half_prize_points)
    ratio = _ratio_table()
    n = len(h["head"])
    counts_t = h["counts"].T  # (14, n): column gathers below read rows
    sums = np.zeros(len(_OUTCOMES))
    for start in range(0, n, block):
        b = slice(start, min(start + block, n))
        weight = h["suits"][None, :] // h["divisor"][None, :]
        for j in range(4):
            weight = weight * ratio[h["own_counts"][b, j, None], counts_t[h["own_ranks"][b, j]]]
        weight //= h["divisor"][b, None]
        special = np.sign(h["special"][b, None] - h["special"][None, :])
        head = np.sign(h["head"][b, None] - h["head"][None, :])
        last = np.sign(h["last"][b, None] - h["last"][None, :])
        by_groups = np.sign(head + last)
        grouped = special == 0
        result = np.where(grouped, by_groups, special)
        half_b = grouped & (by_groups == 1)
        half_b &= ((head == 1) & (h["head_six"][b, None] == 1)) | ((last == 1) & (h["last_six"][b, None] == 1))
        half_p = grouped & (by_groups == -1)
        half_p &= ((head == -1) & (h["head_six"][None, :] == 1)) | ((last == -1) & (h["last_six"][None, :] == 1))
        code = 2 - 2 * result + half_b - half_p  # the index in _OUTCOMES
        # float64 sums are exact here: every partial sum is an integer below 2**53.
        sums += np.bincount(code.ravel(), weights=weight.ravel(), minlength=len(_OUTCOMES))
        if progress is not None:
            progress(min(start + block, n), n)
    counts = DuelCounts(**{name: round(total) for name, total in zip(_OUTCOMES, sums, strict=True)})
    if counts.total != DUELS_TOTAL:
        raise AssertionError(f"enumeration covers {counts.total} deals, expected {DUELS_TOTAL}")
    return counts


def main_bet_rtp(config: bai_buu.BaiBuuConfig, counts_by_points: Mapping[int, DuelCounts]) -> dict[str, Fraction]:
    """Exact RTP of ``banker_0k`` and ``player_0k`` under ``config`` (half prize off: no halving)."""
    counts = counts_by_points[config.half_prize_points]
    if not config.half_prize:
        counts = DuelCounts(
            counts.banker_full + counts.banker_half, 0, counts.tie, counts.player_full + counts.player_half, 0
        )
    return {"banker": counts.rtp("banker", config.odds), "player": counts.rtp("player", config.odds)}


def main_bet_variance(config: bai_buu.BaiBuuConfig, counts_by_points: Mapping[int, DuelCounts]) -> dict[str, Fraction]:
    """Exact variance of the net result per unit staked of ``banker_0k`` and ``player_0k``."""
    counts = counts_by_points[config.half_prize_points]
    if not config.half_prize:
        counts = DuelCounts(
            counts.banker_full + counts.banker_half, 0, counts.tie, counts.player_full + counts.player_half, 0
        )
    return {side: counts.variance(side, config.odds) for side in ("banker", "player")}


def four_of_a_kind_hands(hands_dealt: int = len(bai_buu.SEATS)) -> dict[int, Fraction]:
    """P(exactly j of the round's four hands hold four of a kind), j = 0..4, exact.

    Inclusion-exclusion over P_m, the chance that m given hands all hold four of a
    kind: 13 x 12 x ... ranks over C(52,4) x C(48,4) x ... deals.
    """
    p_all = [Fraction(1)]
    for m in range(1, hands_dealt + 1):
        p_all.append(p_all[-1] * Fraction(13 - (m - 1), math.comb(52 - 4 * (m - 1), 4)))
    n = hands_dealt
    return {
        j: sum(((-1) ** (m - j) * math.comb(m, j) * math.comb(n, m) * p_all[m] for m in range(j, n + 1)), Fraction(0))
        for j in range(n + 1)
    }


@dataclass(frozen=True, slots=True)
class JackpotModel:
    """Long-run return of one jackpot bet under a betting pattern, per unit staked.

    ``bets_per_round`` = 4: a jackpot bet on every hand every round; 1: one bet on
    one hand every round and no other jackpot bets. The pool at a round is the
    reset amount plus the contributions of the rounds since the last payout (the
    seed amount, never above the reset amount, only tops up the very first pool,
    which does not count in the long run); with
    a payout chance ``hit_rate`` per round, independent between rounds, the number
    of those rounds (this one included) is geometric, which makes every figure a
    finite sum (evaluated in double precision; integer rounding of minor units is
    ignored). ``rtp`` = ``pay_table`` + ``pool`` (contributions, all paid back in
    the long run) + ``seed`` (the house's seed/reset funding) + ``floor`` (the
    house's top-ups of four-of-a-kind prizes to the three-of-a-kind prize).
    """

    bets_per_round: int
    rtp: float
    variance: float
    pay_table: float
    pool: float
    seed: float
    floor: float
    hit_rate: float  # rounds that pay the pool
    mean_prize: float  # mean four-of-a-kind prize per winning bet, per unit staked


def jackpot_model(config: bai_buu.BaiBuuConfig, hands: Mapping[str, int], bets_per_round: int) -> JackpotModel:
    """See :class:`JackpotModel`. ``jackpot.split`` does not matter with one bet per hand."""
    if bets_per_round not in (1, 4):
        raise ValueError("modelled patterns: 4 (a bet on every hand) or 1 (one bet on one hand)")
    total = sum(hands.values())
    stake = config.jackpot_stake_minor
    three, flush = Fraction(hands["three_of_a_kind"], total), Fraction(hands["flush"], total)
    pay_table = three * config.jackpot_pay_three_of_a_kind + flush * config.jackpot_pay_flush
    pay_second = three * config.jackpot_pay_three_of_a_kind**2 + flush * config.jackpot_pay_flush**2
    share = Fraction(config.jackpot_pool_share_bps, money.BPS_DENOMINATOR)
    start = Fraction(config.jackpot_reset_minor, stake)  # at least the seed, which only the first payout sees
    low = Fraction(bai_buu.four_of_a_kind_floor_minor(stake, config), stake)
    if bets_per_round == 4:
        by_count = four_of_a_kind_hands()
        weights = {j: Fraction(j, 4) * by_count[j] for j in range(1, 5)}  # this hand wins, j hands in all
        hit = 1 - by_count[0]
    else:
        weights = {1: Fraction(hands["four_of_a_kind"], total)}
        hit = weights[1]
    p, c, r0, floor_ = float(hit), float(bets_per_round * share), float(start), float(low)
    mean_a, mean_a2 = 1 / p, (2 - p) / p**2  # of the geometric number of rounds
    first = second = top_up = 0.0
    for j, weight in weights.items():
        mean_y = (r0 + c * mean_a) / j
        mean_y2 = (r0 * r0 + 2 * r0 * c * mean_a + c * c * mean_a2) / j**2
        under = under2 = 0.0  # the floor's corrections, over the a with y_a < floor
        if c == 0:  # no contributions: the prize is the reset amount's share every time
            y = r0 / j
            under, under2 = max(0.0, floor_ - y), max(0.0, floor_ * floor_ - y * y)
        a = 1
        while c > 0 and (y := (r0 + c * a) / j) < floor_:  # finitely many: y grows with a
            chance = p * (1 - p) ** (a - 1)
            under += chance * (floor_ - y)
            under2 += chance * (floor_ * floor_ - y * y)
            a += 1
        first += float(weight) * (mean_y + under)
        second += float(weight) * (mean_y2 + under2)
        top_up += float(weight) * under
    rtp = float(pay_table) + first
    return JackpotModel(
        bets_per_round=bets_per_round,
        rtp=rtp,
        variance=float(pay_second) + second - rtp * rtp,
        pay_table=float(pay_table),
        pool=float(share),
        seed=r0 * p / bets_per_round,
        floor=top_up,
        hit_rate=p,
        mean_prize=first / float(sum(weights.values())),
    )


def jackpot_rtp(config: bai_buu.BaiBuuConfig, hands: Mapping[str, int]) -> dict[str, Fraction]:
    """Exact return of one jackpot bet: pay table part plus the long-run pool part.

    In the long run every contribution to the pool is paid back to jackpot bettors
    (the pool is never seeded or skimmed by the house), so the pool adds exactly
    ``pool_share_bps`` to the return of jackpot bets taken together.
    """
    total = sum(hands.values())
    table = (
        hands["three_of_a_kind"] * config.jackpot_pay_three_of_a_kind + hands["flush"] * config.jackpot_pay_flush
    ) / total
    pool = Fraction(config.jackpot_pool_share_bps, money.BPS_DENOMINATOR)
    return {"pay_table": table, "pool": pool, "total": table + pool}


# ---------------------------------------------------------------------------
# Monte Carlo over the real deal and settlement functions


@dataclass(frozen=True, slots=True)
class MonteCarlo:
    rounds: int
    rtp: dict[str, float]
    ci95: dict[str, tuple[float, float]]
    pool_end_minor: int
    four_of_a_kind_rounds: int


MC_STAKE_MINOR = 10_000


def monte_carlo(
    config: bai_buu.BaiBuuConfig,
    rounds: int,
    seed: int,
    *,
    pool_start_minor: int = 0,
    progress: ProgressFn | None = None,
) -> MonteCarlo:
    """Play ``rounds`` rounds with one bet on every area; RTP per bet type with a 95% CI.

    Uses :func:`bai_buu.deal` and :func:`bai_buu.settle` themselves, so it checks the
    exact figures end to end. Returns per round and bet type are i.i.d. except the
    jackpot pool's, whose CI is therefore only indicative.
    """
    rng = np.random.default_rng(seed)
    kinds = ("banker", "player", "jackpot")
    bets = [bai_buu.Bet(area, "p", area, MC_STAKE_MINOR) for area in bai_buu.MAIN_AREAS]
    jackpots = [bai_buu.Bet(area, "p", area, config.jackpot_stake_minor) for area in bai_buu.JACKPOT_AREAS]
    kind_of = {area: ("jackpot" if area.startswith("jackpot") else area.split("_")[0]) for area in bai_buu.AREA_LABELS}
    returns = {kind: np.zeros(rounds) for kind in kinds}
    pool = pool_start_minor
    fours = 0
    for r in range(rounds):
        order = rng.permutation(52)
        the_deal = bai_buu.deal([DECK_52[i] for i in order])
        settlement = bai_buu.settle(the_deal, bets, jackpots, pool, config)
        per_kind: dict[str, list[float]] = {kind: [] for kind in kinds}
        for result in settlement.bets:
            per_kind[kind_of[result.area]].append(1 + result.net_minor / result.stake_minor)
        for kind in kinds:
            returns[kind][r] = sum(per_kind[kind]) / len(per_kind[kind])
        fours += any(h.special is bai_buu.Special.FOUR_OF_A_KIND for h in (the_deal.banker, *the_deal.players))
        pool = bai_buu.pool_after(settlement, pool)
        if progress is not None and (r + 1) % 1000 == 0:
            progress(r + 1, rounds)
    rtp, ci = {}, {}
    for kind, values in returns.items():
        mean = float(values.mean())
        half = Z95 * float(values.std(ddof=1)) / math.sqrt(rounds) if rounds > 1 else math.inf
        rtp[kind] = mean
        ci[kind] = (mean - half, mean + half)
    return MonteCarlo(rounds, rtp, ci, pool, fours)
