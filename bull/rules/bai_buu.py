"""Bai Buu (variant id ``bai_buu``): the pure rules, docs/rules/bai_buu.md.

A banker hand and three player hands (``player_01`` .. ``player_03``) of four
cards each, from one 52-card deck. Cards 1-2 of a hand are its *head*, cards 3-4
its *last*; each two-card *group* is compared with the same group of the other
hand and the two group results combine through the seed's table.

Deal convention (part of the provably-fair contract): from the shuffled deck
order the banker takes cards 0-3, ``player_01`` cards 4-7, ``player_02`` cards
8-11 and ``player_03`` cards 12-15, each hand in that order (so deck positions
4k, 4k+1 are the head of seat k and 4k+2, 4k+3 its last). The other 36 cards are
not used.

Money (everything in integer minor units):

* ``banker_0k`` / ``player_0k`` are even-money bets against the house at
  ``odds`` (stake included: 2 returns twice the stake). Tie: stake back. When
  the winning side won its head or its last with a non-pair group worth
  ``half_prize_points`` (6), the profit is halved. The house is the
  counterparty; the hold is the stake.
* ``jackpot_banker`` / ``jackpot_player_0k`` are side bets at a fixed stake on
  one hand. The stake always leaves the bettor: ``jackpot.pool_share_bps`` of it
  to ``JACKPOT_POOL``, the rest to ``HOUSE``. Three of a kind and a four-card
  flush are paid from the house at ``jackpot.pay.*`` *for 1* (the figure
  includes the stake: 50 for 1 on 1.00 nets +49.00, as in the seed's example).
  Four of a kind wins the progressive pool, split among the winning jackpot bets
  (``jackpot.split`` = ``bets``: equal per winning bet, which is pro rata to stake
  since every jackpot bet has the same fixed stake; ``hands``: equally between the
  hands holding four of a kind, then between the bets on each hand, a share of an
  unbet hand staying in the pool). With ``jackpot.four_of_a_kind_floor`` (default)
  a winning bet never gets less than the three-of-a-kind prize: the house pays the
  difference. A round that pays the pool finds at least ``jackpot.seed_minor`` in
  it (the house adds what is missing before paying) and leaves it at
  ``jackpot.reset_minor`` (at least the seed; the house adds it after paying),
  each time with a ``JACKPOT_SEED`` transfer (``HOUSE`` -> ``JACKPOT_POOL``, no bet
  id) in that round's settlement. Only rounds that pay the pool move house money
  into it, so only they need the pool's balance (the table reads it under its
  jackpot lock for exactly those rounds).

Rounding: every amount owed to a bettor is rounded down (toward the house) and
the fraction left behind is recorded in ``Settlement.remainders`` under the bet
id; the pool/house split of a jackpot stake rounds the pool's share down.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from fractions import Fraction

from bull import money
from bull.cards import DECK_52, Card, CardError, check_distinct
from bull.rules.config import (
    ConfigError,
    Settings,
    as_bool,
    as_choice,
    as_fraction,
    as_int,
    check_keys,
)

VARIANT_ID = "bai_buu"

BANKER = "banker"
PLAYER_SEATS = ("player_01", "player_02", "player_03")
SEATS = (BANKER, *PLAYER_SEATS)
HAND_SIZE = 4
CARDS_DEALT = HAND_SIZE * len(SEATS)

# Bet areas. The seed calls them "Banker (01-03)", "Player (01-03)" and
# "Jackpot Banker / Jackpot Player (01-03)"; ``AREA_LABELS`` keeps its spelling.
BANKER_AREAS = ("banker_01", "banker_02", "banker_03")
PLAYER_AREAS = ("player_01", "player_02", "player_03")
MAIN_AREAS = BANKER_AREAS + PLAYER_AREAS
JACKPOT_AREAS = ("jackpot_banker", "jackpot_player_01", "jackpot_player_02", "jackpot_player_03")
AREA_LABELS: Mapping[str, str] = {
    "banker_01": "Banker 01",
    "banker_02": "Banker 02",
    "banker_03": "Banker 03",
    "player_01": "Player 01",
    "player_02": "Player 02",
    "player_03": "Player 03",
    "jackpot_banker": "Jackpot Banker",
    "jackpot_player_01": "Jackpot Player 01",
    "jackpot_player_02": "Jackpot Player 02",
    "jackpot_player_03": "Jackpot Player 03",
}


class BetError(ValueError):
    """A bet that the rules cannot settle (unknown area, wrong jackpot stake, ...)."""


# ---------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True, slots=True)
class BaiBuuConfig:
    """Validated settings; build it with :func:`load_config` from dotted keys."""

    odds: Fraction = Fraction(2)
    half_prize: bool = True
    half_prize_points: int = 6
    jackpot_stake_minor: int = 100
    jackpot_pay_three_of_a_kind: Fraction = Fraction(50)
    jackpot_pay_flush: Fraction = Fraction(20)
    jackpot_pool_share_bps: int = 1000
    jackpot_seed_minor: int = 0
    jackpot_reset_minor: int = 0
    jackpot_split: str = "bets"  # JACKPOT_SPLITS
    jackpot_four_of_a_kind_floor: bool = True

    def __post_init__(self) -> None:
        if self.jackpot_split not in JACKPOT_SPLITS:
            raise ConfigError("jackpot.split", f"expected one of {', '.join(JACKPOT_SPLITS)}")
        if self.jackpot_reset_minor < self.jackpot_seed_minor:
            raise ConfigError("jackpot.reset_minor", "must be at least jackpot.seed_minor")

    @property
    def profit_ratio(self) -> Fraction:
        return self.odds - 1


# "bets": the pool is split equally among the winning jackpot bets (the seed's "if more than one
# winning ... it will be split" read as winning bets); "hands": equally among the hands holding four
# of a kind, then among the bets on each hand (an unbet hand's share stays in the pool).
JACKPOT_SPLITS = ("bets", "hands")

DEFAULT_CONFIG = BaiBuuConfig()

CONFIG_KEYS = (
    "odds",
    "half_prize",
    "half_prize_points",
    "jackpot.stake_minor",
    "jackpot.pay.three_of_a_kind",
    "jackpot.pay.flush",
    "jackpot.pool_share_bps",
    "jackpot.seed_minor",
    "jackpot.reset_minor",
    "jackpot.split",
    "jackpot.four_of_a_kind_floor",
)


def load_config(settings: Settings | None = None) -> BaiBuuConfig:
    """Build a config from dotted keys (nested tables allowed); unknown keys are errors."""
    flat = check_keys(settings or {}, CONFIG_KEYS)
    base = DEFAULT_CONFIG
    max_pay = Fraction(1_000_000)

    def frac(key: str, default: Fraction, low: Fraction) -> Fraction:
        return as_fraction(key, flat[key], low=low, high=max_pay) if key in flat else default

    def integer(key: str, default: int, low: int, high: int) -> int:
        return as_int(key, flat[key], low=low, high=high) if key in flat else default

    seed = integer("jackpot.seed_minor", base.jackpot_seed_minor, 0, 10**12)
    floor_key = "jackpot.four_of_a_kind_floor"
    return BaiBuuConfig(
        odds=frac("odds", base.odds, Fraction(1)),
        half_prize=as_bool("half_prize", flat["half_prize"]) if "half_prize" in flat else base.half_prize,
        half_prize_points=integer("half_prize_points", base.half_prize_points, 0, 9),
        jackpot_stake_minor=integer("jackpot.stake_minor", base.jackpot_stake_minor, 1, 10**12),
        jackpot_pay_three_of_a_kind=frac("jackpot.pay.three_of_a_kind", base.jackpot_pay_three_of_a_kind, Fraction(0)),
        jackpot_pay_flush=frac("jackpot.pay.flush", base.jackpot_pay_flush, Fraction(0)),
        jackpot_pool_share_bps=integer("jackpot.pool_share_bps", base.jackpot_pool_share_bps, 0, money.BPS_DENOMINATOR),
        jackpot_seed_minor=seed,
        # Unset, the reset amount is the seed amount.
        jackpot_reset_minor=integer("jackpot.reset_minor", seed, 0, 10**12),
        jackpot_split=as_choice("jackpot.split", flat["jackpot.split"], JACKPOT_SPLITS)
        if "jackpot.split" in flat
        else base.jackpot_split,
        jackpot_four_of_a_kind_floor=as_bool(floor_key, flat[floor_key])
        if floor_key in flat
        else base.jackpot_four_of_a_kind_floor,
    )


def config_settings(config: BaiBuuConfig) -> dict[str, str]:
    """The dotted-key form of a config (round-trips through :func:`load_config`)."""
    return {
        "odds": str(config.odds),
        "half_prize": str(config.half_prize).lower(),
        "half_prize_points": str(config.half_prize_points),
        "jackpot.stake_minor": str(config.jackpot_stake_minor),
        "jackpot.pay.three_of_a_kind": str(config.jackpot_pay_three_of_a_kind),
        "jackpot.pay.flush": str(config.jackpot_pay_flush),
        "jackpot.pool_share_bps": str(config.jackpot_pool_share_bps),
        "jackpot.seed_minor": str(config.jackpot_seed_minor),
        "jackpot.reset_minor": str(config.jackpot_reset_minor),
        "jackpot.split": config.jackpot_split,
        "jackpot.four_of_a_kind_floor": str(config.jackpot_four_of_a_kind_floor).lower(),
    }


# ---------------------------------------------------------------------------
# Two-card groups

FACE_RANKS = frozenset({11, 12, 13})
TEN = 10
NINE = 9
ACE = 1
PAIR_BASE = 100  # every pair's strength is above every non-pair's


def pair_order(rank: int) -> int:
    """Pairs rank 2 < 3 < ... < K < A: the ace counts 14."""
    return 14 if rank == ACE else rank


def group_points_x2(rank_a: int, rank_b: int) -> int:
    """Points of a non-pair in halves (9.5 -> 19, the top two-faces 10 -> 20)."""
    if rank_a == rank_b:
        raise CardError("a pair has no points")
    ranks = {rank_a, rank_b}
    if ranks == {NINE, ACE}:
        return 19
    if ranks <= FACE_RANKS:
        return 20
    if len(ranks & FACE_RANKS) == 1 and TEN in ranks:
        return 0
    return 2 * ((min(rank_a, 10) + min(rank_b, 10)) % 10)


@dataclass(frozen=True, slots=True)
class Group:
    """A two-card group; ``strength`` orders groups (equal strength = that group ties)."""

    cards: tuple[Card, Card]
    pair_rank: int  # 0 for a non-pair, else 2..14 (ace high)
    points_x2: int  # non-pair points in halves (0..20); 0 for a pair

    @property
    def is_pair(self) -> bool:
        return self.pair_rank != 0

    @property
    def strength(self) -> int:
        return PAIR_BASE + self.pair_rank if self.is_pair else self.points_x2

    @property
    def category(self) -> str:
        return group_category(self.pair_rank, self.points_x2)

    def has_points(self, points: int) -> bool:
        """A non-pair worth exactly ``points`` (a pair of 3s is a pair, not 6 points)."""
        return not self.is_pair and self.points_x2 == 2 * points


def group_category(pair_rank: int, points_x2: int) -> str:
    """``pair_A`` .. ``pair_2``, ``points_10``, ``points_9_5``, ``points_9`` .. ``points_0``."""
    if pair_rank:
        return "pair_" + "A23456789TJQKA"[pair_rank - 1]
    whole, half = divmod(points_x2, 2)
    return f"points_{whole}_5" if half else f"points_{whole}"


GROUP_CATEGORIES: tuple[str, ...] = tuple(
    [group_category(rank, 0) for rank in range(14, 1, -1)]
    + [group_category(0, x2) for x2 in (20, 19, *range(18, -1, -2))]
)


def make_group(first: Card, second: Card) -> Group:
    if first.is_joker or second.is_joker:
        raise CardError("Bai Buu uses a 52-card deck: no jokers")
    if first == second:
        raise CardError(f"duplicate card: {first.code}")
    if first.rank == second.rank:
        return Group((first, second), pair_order(first.rank), 0)
    return Group((first, second), 0, group_points_x2(first.rank, second.rank))


# ---------------------------------------------------------------------------
# Hands


class Special(IntEnum):
    """Whole-hand specials, weakest first; equal specials fall back to the groups."""

    NONE = 0
    THREE_OF_A_KIND = 1
    FOUR_OF_A_KIND = 2


HAND_CATEGORIES = ("four_of_a_kind", "three_of_a_kind", "flush", "plain")
JACKPOT_CATEGORIES = ("four_of_a_kind", "three_of_a_kind", "flush")


@dataclass(frozen=True, slots=True)
class Hand:
    cards: tuple[Card, ...]
    head: Group
    last: Group
    special: Special
    flush: bool

    @property
    def category(self) -> str:
        """Census category: the special, else ``flush`` (jackpot only), else ``plain``."""
        if self.special is Special.FOUR_OF_A_KIND:
            return "four_of_a_kind"
        if self.special is Special.THREE_OF_A_KIND:
            return "three_of_a_kind"
        return "flush" if self.flush else "plain"

    @property
    def jackpot(self) -> str | None:
        """What a jackpot bet on this hand wins with, if anything."""
        category = self.category
        return None if category == "plain" else category


def special_of(ranks: Sequence[int]) -> Special:
    top = max(Counter(ranks).values())
    if top == 4:
        return Special.FOUR_OF_A_KIND
    if top == 3:
        return Special.THREE_OF_A_KIND
    return Special.NONE


def make_hand(cards: Sequence[Card]) -> Hand:
    """Evaluate four cards in deal order: the first two are the head, the last two the last."""
    if len(cards) != HAND_SIZE:
        raise CardError(f"a Bai Buu hand has {HAND_SIZE} cards, not {len(cards)}")
    check_distinct(cards)
    c = tuple(cards)
    return Hand(
        cards=c,
        head=make_group(c[0], c[1]),
        last=make_group(c[2], c[3]),
        special=special_of([card.rank for card in c]),
        flush=len({card.suit for card in c}) == 1,
    )


@dataclass(frozen=True, slots=True)
class Deal:
    banker: Hand
    players: tuple[Hand, Hand, Hand]

    def hand(self, seat: str) -> Hand:
        if seat == BANKER:
            return self.banker
        try:
            return self.players[PLAYER_SEATS.index(seat)]
        except ValueError:
            raise BetError(f"no seat {seat!r} (seats: {', '.join(SEATS)})") from None


def deal(deck_order: Sequence[Card]) -> Deal:
    """Deal from a shuffled 52-card deck: four consecutive cards per seat, banker first."""
    if len(deck_order) != len(DECK_52) or set(deck_order) != set(DECK_52):
        raise CardError("deck order must be a permutation of the 52-card deck")
    hands = [make_hand(deck_order[i * HAND_SIZE : (i + 1) * HAND_SIZE]) for i in range(len(SEATS))]
    return Deal(hands[0], (hands[1], hands[2], hands[3]))


def check_distinct_hands(*hands: Hand) -> None:
    """Raise CardError if two hands share a card (they come from one deck)."""
    check_distinct([card for hand in hands for card in hand.cards])


def deal_hands(hands: Sequence[Sequence[Card]]) -> Deal:
    """A deal from four explicit hands (banker first); cards must be distinct across hands."""
    if len(hands) != len(SEATS):
        raise CardError(f"expected {len(SEATS)} hands, got {len(hands)}")
    check_distinct([card for hand in hands for card in hand])
    made = [make_hand(hand) for hand in hands]
    return Deal(made[0], (made[1], made[2], made[3]))


# ---------------------------------------------------------------------------
# Comparison


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def compare_groups(a: Group, b: Group) -> int:
    """1 if ``a`` beats ``b``, 0 tie, -1 if ``b`` wins. A total preorder on groups."""
    return _sign(a.strength - b.strength)


def combine(head: int, last: int) -> int:
    """The seed's head/last table: W+W, W+T, T+W win; W+L, L+W, T+T tie; the rest lose."""
    return _sign(head + last)


@dataclass(frozen=True, slots=True)
class Duel:
    """Hand ``a`` against hand ``b``; every result is from ``a``'s side (1 = ``a`` wins)."""

    result: int
    head: int
    last: int
    decided_by: str  # "four_of_a_kind", "three_of_a_kind" (special beats no special) or "groups"
    half_prize: bool  # the winner won its head or its last with the half-prize points

    @property
    def reason(self) -> str:
        names = {1: "win", 0: "tie", -1: "lose"}
        if self.decided_by != "groups":
            return f"{self.decided_by.replace('_', ' ')} beats a lesser hand"
        text = f"head {names[self.head]}, last {names[self.last]}"
        return text + (" (half prize)" if self.half_prize else "")


def duel(a: Hand, b: Hand, config: BaiBuuConfig = DEFAULT_CONFIG) -> Duel:
    head = compare_groups(a.head, b.head)
    last = compare_groups(a.last, b.last)
    if a.special != b.special:
        winner = a.special if a.special > b.special else b.special
        return Duel(_sign(a.special - b.special), head, last, winner.name.lower(), False)
    result = combine(head, last)
    half = False
    if result != 0 and config.half_prize:
        # The winner's own groups that it won: ``a``'s when result is 1, ``b``'s otherwise.
        won = [(g_a, g_b) for g_a, g_b, r in ((a.head, b.head, head), (a.last, b.last, last)) if r == result]
        half = any((g_a if result > 0 else g_b).has_points(config.half_prize_points) for g_a, g_b in won)
    return Duel(result, head, last, "groups", half)


def compare(a: Hand, b: Hand) -> int:
    """1 if ``a`` beats ``b``, 0 tie, -1 if ``b`` wins (antisymmetric, not transitive)."""
    return duel(a, b).result


# ---------------------------------------------------------------------------
# Bets and settlement


@dataclass(frozen=True, slots=True)
class Bet:
    bet_id: str
    player: str
    area: str
    stake_minor: int


def hold_minor(bet: Bet) -> int:
    """What the wallet holds when the bet is accepted: the stake (no bet can lose more)."""
    return bet.stake_minor


def check_bet(bet: Bet, config: BaiBuuConfig = DEFAULT_CONFIG) -> None:
    """Raise BetError unless the bet can be accepted under ``config``."""
    if bet.area not in MAIN_AREAS and bet.area not in JACKPOT_AREAS:
        raise BetError(f"bet {bet.bet_id}: unknown area {bet.area!r}")
    if type(bet.stake_minor) is not int or bet.stake_minor <= 0:
        raise BetError(f"bet {bet.bet_id}: stake must be a positive integer, not {bet.stake_minor!r}")
    if bet.area in JACKPOT_AREAS and bet.stake_minor != config.jackpot_stake_minor:
        raise BetError(f"bet {bet.bet_id}: a jackpot costs exactly {config.jackpot_stake_minor}, not {bet.stake_minor}")
    if bet.player in money.SYSTEM_ACCOUNTS:
        raise BetError(f"bet {bet.bet_id}: {bet.player!r} is a system account")


@dataclass(slots=True)
class _Book:
    """Mutable scratch space while one settlement is assembled (never escapes ``settle``)."""

    results: list[money.BetResult] = field(default_factory=list)
    transfers: list[money.Transfer] = field(default_factory=list)
    remainders: list[tuple[str, int, int]] = field(default_factory=list)

    def move(self, payer: str, payee: str, amount: int, kind: money.TransferKind, bet: Bet) -> None:
        if amount > 0:
            self.transfers.append(money.Transfer(payer, payee, amount, kind, bet.bet_id))

    def remainder(self, bet: Bet, numerator: int, denominator: int) -> None:
        if numerator:
            self.remainders.append((bet.bet_id, numerator, denominator))

    def result(self, bet: Bet, outcome: money.Outcome, net: int) -> None:
        self.results.append(
            money.BetResult(bet.bet_id, bet.player, bet.area, bet.stake_minor, hold_minor(bet), outcome, net)
        )


def main_bet_duel(deal_: Deal, area: str, config: BaiBuuConfig = DEFAULT_CONFIG) -> Duel:
    """The duel that decides a ``banker_0k``/``player_0k`` bet, from the bet's side."""
    side, seat = area.split("_", 1)
    player_hand = deal_.hand(f"player_{seat}")
    if side == "banker":
        return duel(deal_.banker, player_hand, config)
    return duel(player_hand, deal_.banker, config)


def main_profit_ratio(d: Duel, config: BaiBuuConfig) -> Fraction:
    """What a main bet nets per unit of stake in the duel ``d``: -1, 0, or the (halved) profit."""
    if d.result <= 0:
        return Fraction(d.result)
    return config.profit_ratio / 2 if d.half_prize else config.profit_ratio


def main_outcome(d: Duel, config: BaiBuuConfig) -> money.Outcome:
    """A main bet's outcome by what it nets (odds 1 win nothing: a push); ``HALF_WIN`` for a halved gain."""
    outcome = money.outcome_of(main_profit_ratio(d, config))
    return money.Outcome.HALF_WIN if outcome is money.Outcome.WIN and d.half_prize else outcome


def jackpot_outcome(hand: Hand, config: BaiBuuConfig) -> money.Outcome | None:
    """A jackpot bet's outcome on ``hand`` by what it nets; None for four of a kind, whose net
    depends on the pool and on how many bets share it (the settlement says)."""
    category = hand.jackpot
    if category == "four_of_a_kind":
        return None
    pay = {"three_of_a_kind": config.jackpot_pay_three_of_a_kind, "flush": config.jackpot_pay_flush}
    return money.outcome_of(pay[category] - 1) if category is not None else money.Outcome.LOSS


def _settle_main(book: _Book, deal_: Deal, bet: Bet, config: BaiBuuConfig) -> None:
    d = main_bet_duel(deal_, bet.area, config)
    outcome = main_outcome(d, config)
    if d.result < 0:
        book.move(bet.player, money.HOUSE, bet.stake_minor, money.TransferKind.LOSS, bet)
        book.result(bet, outcome, -bet.stake_minor)
        return
    ratio = main_profit_ratio(d, config)
    profit, rest = money.floor_div_toward_house(bet.stake_minor * ratio.numerator, ratio.denominator)
    book.move(money.HOUSE, bet.player, profit, money.TransferKind.WIN, bet)
    book.remainder(bet, rest, ratio.denominator)
    book.result(bet, outcome, profit)


def _collect_jackpot_stakes(book: _Book, jackpot_bets: Sequence[Bet], config: BaiBuuConfig) -> int:
    contributed = 0
    for bet in jackpot_bets:
        share, rest = money.floor_div_toward_house(
            bet.stake_minor * config.jackpot_pool_share_bps, money.BPS_DENOMINATOR
        )
        book.move(bet.player, money.JACKPOT_POOL, share, money.TransferKind.JACKPOT_CONTRIBUTION, bet)
        book.move(bet.player, money.HOUSE, bet.stake_minor - share, money.TransferKind.JACKPOT_STAKE, bet)
        book.remainder(bet, rest, money.BPS_DENOMINATOR)
        contributed += share
    return contributed


def _jackpot_seat(area: str) -> str:
    return area.removeprefix("jackpot_")


def four_of_a_kind_floor_minor(stake_minor: int, config: BaiBuuConfig) -> int:
    """The least a winning four-of-a-kind bet is paid: the three-of-a-kind prize (0 with the floor off)."""
    if not config.jackpot_four_of_a_kind_floor:
        return 0
    pay = config.jackpot_pay_three_of_a_kind
    return stake_minor * pay.numerator // pay.denominator


def _settle_jackpots(
    book: _Book, deal_: Deal, jackpot_bets: Sequence[Bet], pool_minor: int, config: BaiBuuConfig
) -> int:
    """Pay the jackpot bets; returns what was paid out of the pool."""
    pay_table = {"three_of_a_kind": config.jackpot_pay_three_of_a_kind, "flush": config.jackpot_pay_flush}
    pool_hands = [seat for seat in SEATS if deal_.hand(seat).special is Special.FOUR_OF_A_KIND]
    bets_on = Counter(_jackpot_seat(bet.area) for bet in jackpot_bets)
    winners = [bet for bet in jackpot_bets if deal_.hand(_jackpot_seat(bet.area)).jackpot == "four_of_a_kind"]
    from_pool = 0
    for bet in jackpot_bets:
        category = deal_.hand(_jackpot_seat(bet.area)).jackpot
        if category == "four_of_a_kind":
            if config.jackpot_split == "bets":
                denominator = len(winners)
            else:
                denominator = len(pool_hands) * bets_on[_jackpot_seat(bet.area)]
            # What integer division leaves stays in the pool.
            share, rest = money.floor_div_toward_house(pool_minor, denominator)
            top_up = max(0, four_of_a_kind_floor_minor(bet.stake_minor, config) - share)
            book.move(money.JACKPOT_POOL, bet.player, share, money.TransferKind.JACKPOT_PAYOUT, bet)
            book.move(money.HOUSE, bet.player, top_up, money.TransferKind.JACKPOT_PAYOUT, bet)
            book.remainder(bet, rest, denominator)
            from_pool += share
            payout = share + top_up
            # What the split leaves stays in the pool: the bettor nets the rounded payout, and a
            # payout below the stake (the floor off, a small pool) is a loss.
            outcome = money.outcome_of(payout - bet.stake_minor)
        elif category is not None:
            pay = pay_table[category]
            payout, rest = money.floor_div_toward_house(bet.stake_minor * pay.numerator, pay.denominator)
            book.move(money.HOUSE, bet.player, payout, money.TransferKind.JACKPOT_PAYOUT, bet)
            book.remainder(bet, rest, pay.denominator)
            outcome = money.outcome_of(bet.stake_minor * (pay - 1))
        else:
            book.result(bet, money.Outcome.LOSS, -bet.stake_minor)
            continue
        book.result(bet, outcome, payout - bet.stake_minor)
    return from_pool


def pays_pool(deal_: Deal, jackpot_bets: Sequence[Bet]) -> bool:
    """Whether the round pays the pool: a jackpot bet on a hand holding four of a kind."""
    return any(deal_.hand(_jackpot_seat(bet.area)).jackpot == "four_of_a_kind" for bet in jackpot_bets)


def _fund_pool(book: _Book, amount_minor: int) -> None:
    if amount_minor > 0:
        book.transfers.append(
            money.Transfer(money.HOUSE, money.JACKPOT_POOL, amount_minor, money.TransferKind.JACKPOT_SEED)
        )


def settle(
    deal_: Deal,
    bets: Sequence[Bet],
    jackpot_bets: Sequence[Bet],
    pool_balance_minor: int,
    config: BaiBuuConfig = DEFAULT_CONFIG,
) -> money.Settlement:
    """Settle one round.

    ``bets`` are ``banker_0k``/``player_0k`` bets, ``jackpot_bets`` the jackpot side
    bets; ``pool_balance_minor`` is the ``JACKPOT_POOL`` balance before the round
    (it only matters in a round that pays the pool). This round's contributions
    join the pool before it is paid out; in a round that pays it the house first
    tops it up to ``jackpot.seed_minor`` and afterwards to ``jackpot.reset_minor``,
    so a four of a kind wins at least the seed (see :func:`pool_after`).
    """
    if type(pool_balance_minor) is not int or pool_balance_minor < 0:
        raise BetError(f"pool balance must be a non-negative integer, not {pool_balance_minor!r}")
    ids = [bet.bet_id for bet in (*bets, *jackpot_bets)]
    if len(set(ids)) != len(ids):
        raise BetError("bet ids must be unique")
    for bet in bets:
        check_bet(bet, config)
        if bet.area not in MAIN_AREAS:
            raise BetError(f"bet {bet.bet_id}: {bet.area!r} is not a banker/player area")
    for bet in jackpot_bets:
        check_bet(bet, config)
        if bet.area not in JACKPOT_AREAS:
            raise BetError(f"bet {bet.bet_id}: {bet.area!r} is not a jackpot area")
    book = _Book()
    for bet in bets:
        _settle_main(book, deal_, bet, config)
    pool = pool_balance_minor + _collect_jackpot_stakes(book, jackpot_bets, config)
    hit = pays_pool(deal_, jackpot_bets)
    if hit:
        seed = max(0, config.jackpot_seed_minor - pool)
        _fund_pool(book, seed)
        pool += seed
    paid = _settle_jackpots(book, deal_, jackpot_bets, pool, config)
    if hit:
        _fund_pool(book, max(0, config.jackpot_reset_minor - (pool - paid)))
    return money.Settlement(tuple(book.results), tuple(book.transfers), tuple(book.remainders)).check()


def pool_after(settlement: money.Settlement, pool_balance_minor: int) -> int:
    """The ``JACKPOT_POOL`` balance after a settlement (remainders of a split stay in it)."""
    return pool_balance_minor + settlement.net_by_party().get(money.JACKPOT_POOL, 0)
