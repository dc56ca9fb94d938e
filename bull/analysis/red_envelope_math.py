"""Red-envelope bull math for the census and the report: census, exact and Monte Carlo RTP.

Not part of a round (it imports numpy and is only used by the CLI adapter, the
math report and the tests). The production split is the rng service's
(``bull.fairness.split_envelope``); :func:`double_mean_split` is a local,
vectorised re-implementation of the same distribution (double mean with a floor
of 0.01, then a uniformly random grab order) for simulation only. The simulator
settles with the same integer arithmetic as :func:`red_envelope.settle`; a test
checks it against that function round by round.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from bull import money
from bull.rules import red_envelope as re_

ProgressFn = Callable[[int, int], None]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Z95 = 1.959963984540054
CENSUS_MAX_MINOR = 999  # every amount 0.01 .. 9.99 (the seed's "three digits")


def census(max_minor: int = CENSUS_MAX_MINOR) -> dict[str, int]:
    """Every amount 0.01 .. ``max_minor`` by category, strongest first."""
    counts = Counter(re_.category_of(a) for a in range(1, max_minor + 1))
    return {category: counts.get(category, 0) for category in re_.CATEGORIES}


def strength_table(max_minor: int, config: re_.RedEnvelopeConfig) -> tuple[IntArray, IntArray]:
    """``key[a]`` orders amounts like :func:`red_envelope.compare`; ``mult[a]`` is a's multiplier."""
    key = np.zeros(max_minor + 1, dtype=np.int64)
    mult = np.zeros(max_minor + 1, dtype=np.int64)
    for amount in range(1, max_minor + 1):
        hand = re_.evaluate(amount)
        type_rank, pair, points, _ = hand.key
        key[amount] = ((type_rank * 100 + pair) * 11 + points) * (max_minor + 1) + amount
        mult[amount] = config.multiplier(hand.category)
    return key, mult


def double_mean_split(rng: np.random.Generator, total_minor: int, shares: int, rounds: int) -> IntArray:
    """``rounds`` envelopes of ``shares`` shares each (column = participant position).

    Same distribution as ``fair.split_envelope`` with ``min_minor`` 1: the k-th draw
    is uniform on 1 .. min(2*remaining // left, remaining - (left - 1)), the last
    share takes the rest, and the shares are then dealt in a random grab order.
    """
    if shares < 1 or total_minor < shares:
        raise ValueError(f"cannot split {total_minor} into {shares} shares of at least 1")
    amounts = np.zeros((rounds, shares), dtype=np.int64)
    remaining = np.full(rounds, total_minor, dtype=np.int64)
    for k in range(shares - 1):
        left = shares - k
        high = np.minimum(2 * remaining // left, remaining - (left - 1))
        amounts[:, k] = rng.integers(1, high + 1)
        remaining -= amounts[:, k]
    amounts[:, shares - 1] = remaining
    return rng.permuted(amounts, axis=1)


@dataclass(frozen=True, slots=True)
class RoundNets:
    """Per round (rows) and player (columns, bet order): what the vectorised settlement gave."""

    amounts: IntArray  # column 0 is the dealer
    player_net: IntArray
    dealer_net: IntArray
    void: BoolArray
    drink_water: BoolArray
    immune: BoolArray


def settle_vectorised(
    amounts: IntArray, stake_minor: int, dealer_pool_minor: int | None, config: re_.RedEnvelopeConfig
) -> RoundNets:
    """Settle many rounds at once: column 0 of ``amounts`` is the dealer, every player stakes the same.

    ``dealer_pool_minor=None`` means a pool large enough that nobody drinks water.
    """
    key, mult = strength_table(int(amounts.max()), config)
    bps = money.BPS_DENOMINATOR
    dealer, players = amounts[:, :1], amounts[:, 1:]
    k_d, k_p = key[dealer], key[players]
    void = dealer[:, 0] == re_.VOID_AMOUNT_MINOR
    win, lose = k_p > k_d, k_p < k_d
    immune = lose & (players == re_.VOID_AMOUNT_MINOR)
    lose &= ~immune
    rebate = stake_minor * config.rebate_bps // bps

    pay = stake_minor * mult[dealer]  # (rounds, 1), broadcast over players
    if config.dealer_commission_base == "win":
        dealer_kept = pay * (bps - config.dealer_commission_bps) // bps
    else:
        dealer_kept = (pay * bps - stake_minor * config.dealer_commission_bps) // bps
    pool = np.iinfo(np.int64).max // 4 if dealer_pool_minor is None else dealer_pool_minor
    share = dealer_kept if config.drink_water_base == "paid" else np.minimum(stake_minor, dealer_kept)
    budget = pool + (lose * share).sum(axis=1)

    full = stake_minor * mult[players] * win
    # Strongest winner first, equal hands in bet order: a stable sort on -key (non-winners last).
    order = np.argsort(np.where(win, -k_p, 1), axis=1, kind="stable")
    gross = _pay_winners(np.take_along_axis(full, order, axis=1), budget, config.drink_water)
    gross = _unsort(gross, order)
    paid = win & (gross > 0)
    drink = win & ~paid

    player_kept = gross * (bps - config.player_commission_bps) // bps
    player_net = np.where(paid, player_kept + rebate, 0) + np.where(lose, rebate - pay, 0)
    dealer_net = (lose * dealer_kept).sum(axis=1) - (paid * gross).sum(axis=1) - config.dealer_fees_minor
    player_net[void] = 0
    dealer_net[void] = 0
    return RoundNets(amounts, player_net, dealer_net, void, drink & ~void[:, None], immune & ~void[:, None])


def _pay_winners(owed: IntArray, budget: IntArray, rule: str) -> IntArray:
    """What each winner is paid, columns strongest first, under the ``drink_water`` rule (0 = 喝水)."""
    paid = np.zeros_like(owed)
    left = budget.copy()
    stopped = np.zeros(len(owed), dtype=bool)
    for column in range(owed.shape[1]):
        want = owed[:, column]
        short = want > left
        pay = np.where(stopped, 0, np.where(short, left if rule == "partial" else 0, want))
        if rule != "skip":
            stopped |= short
        paid[:, column] = pay
        left -= pay
    return paid


def _unsort(values: IntArray, order: IntArray) -> IntArray:
    out = np.zeros_like(values)
    np.put_along_axis(out, order, values, axis=1)
    return out


@dataclass(frozen=True, slots=True)
class Estimate:
    """A Monte Carlo estimate of a player bet's return per unit staked, with its 95% CI."""

    participants: int
    rounds: int  # rounds played, voided ones included
    rtp: float
    ci95: tuple[float, float]
    void_rate: float
    drink_water_rate: float  # per bet, among non-void rounds
    immune_rate: float
    dealer_return: float  # dealer's mean net per round, per unit of the total stake against him
    house_take: float  # commission + fees - rebates, per unit staked
    variance: float = 0.0  # of one live bet's net result per unit staked


def _ratio_ci(numerators: npt.NDArray[np.float64], denominators: npt.NDArray[np.float64]) -> tuple[float, float]:
    """Ratio estimate sum(a)/sum(b) over i.i.d. rounds and its 95% half-width (delta method)."""
    ratio = float(numerators.sum() / denominators.sum())
    n = len(numerators)
    if n < 2:
        return ratio, math.inf
    residual = numerators - ratio * denominators
    se = math.sqrt(float((residual**2).sum()) / (n * (n - 1))) / float(denominators.mean())
    return ratio, Z95 * se


def simulate(
    rng: np.random.Generator,
    config: re_.RedEnvelopeConfig,
    participants: int,
    rounds: int,
    *,
    stake_minor: int = 1000,
    dealer_pool_minor: int | None = None,
    batch: int = 50_000,
    progress: ProgressFn | None = None,
) -> Estimate:
    """RTP of one player bet when every player stakes ``stake_minor``.

    Variance reduction (Rao-Blackwell over the grab order): each simulated split is
    settled ``participants`` times, once with each share as the dealer's (players
    keep the others in their random order). The grab order is uniformly random, so
    this is an unbiased average over who is the dealer, and the part of the game
    that is symmetric between dealer and players cancels within each round.
    Voided settlements (the dealer holds 0.01) are re-dealt: they count in
    ``void_rate`` but not in the return, which is a ratio estimate (player net over
    live stakes) with a delta-method 95% interval over rounds.
    """
    if participants < 2:
        raise ValueError("a round needs the dealer and at least one player")
    players = participants - 1
    player_sums: list[npt.NDArray[np.float64]] = []
    live_bets: list[npt.NDArray[np.float64]] = []
    dealer_total = square_total = 0.0
    voids = drinks = immunes = 0
    done = 0
    while done < rounds:
        n = min(batch, rounds - done)
        split = double_mean_split(rng, config.envelope_total_minor, participants, n)
        player_sum = np.zeros(n)
        live = np.zeros(n)
        for dealer_column in range(participants):
            columns = [dealer_column, *(c for c in range(participants) if c != dealer_column)]
            nets = settle_vectorised(split[:, columns], stake_minor, dealer_pool_minor, config)
            player_sum += nets.player_net.sum(axis=1) / stake_minor
            square_total += float(np.square(nets.player_net / stake_minor).sum())
            live += players * ~nets.void
            dealer_total += float(nets.dealer_net.sum()) / stake_minor
            voids += int(nets.void.sum())
            drinks += int(nets.drink_water.sum())
            immunes += int(nets.immune.sum())
        player_sums.append(player_sum)
        live_bets.append(live)
        done += n
        if progress is not None:
            progress(done, rounds)
    live_all = np.concatenate(live_bets)
    net_rate, half = _ratio_ci(np.concatenate(player_sums), live_all)
    rtp = 1 + net_rate
    dealer_return = dealer_total / float(live_all.sum())
    second_moment = square_total / float(live_all.sum())  # void settlements add 0 to the sum
    return Estimate(
        participants=participants,
        rounds=rounds,
        rtp=rtp,
        ci95=(rtp - half, rtp + half),
        void_rate=voids / (rounds * participants),
        drink_water_rate=drinks / float(live_all.sum()),
        immune_rate=immunes / float(live_all.sum()),
        dealer_return=dealer_return,
        house_take=-net_rate - dealer_return,
        variance=second_moment - net_rate * net_rate,
    )


def exact_two_player_moments(config: re_.RedEnvelopeConfig, stake_minor: int = 1000) -> tuple[Fraction, Fraction]:
    """(RTP, variance of the net per unit staked), exact, two participants and an unlimited pool."""
    total = config.envelope_total_minor
    amounts = np.array([[d, total - d] for d in range(2, total)], dtype=np.int64)
    nets = settle_vectorised(amounts, stake_minor, None, config)
    values = [int(v) for v in nets.player_net[:, 0]]
    n = len(values) * stake_minor
    mean = Fraction(sum(values), n)
    second = Fraction(sum(v * v for v in values), n * stake_minor)
    return 1 + mean, second - mean * mean


def exact_two_player_rtp(config: re_.RedEnvelopeConfig, stake_minor: int = 1000) -> Fraction:
    """Exact RTP with two participants (dealer and one player) and an unlimited pool.

    With two shares the first draw is uniform on 1 .. total-1 and the grab order is
    a fair coin, so the dealer's amount is uniform on 1 .. total-1 and the player
    holds the rest; rounds where the dealer holds 0.01 are re-dealt.
    """
    total = config.envelope_total_minor
    amounts = np.array([[d, total - d] for d in range(2, total)], dtype=np.int64)
    nets = settle_vectorised(amounts, stake_minor, None, config)
    return 1 + Fraction(int(nets.player_net.sum()), stake_minor * len(amounts))
