"""Bai Buu rules: the seed's statements and examples, properties, census and exact math."""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bull import money
from bull.analysis import bai_buu_math as bm
from bull.cards import DECK_52, Card, CardError, parse_cards
from bull.rules import bai_buu
from bull.rules.config import ConfigError
from bull.variants import Funding, SeatHand, TableBet
from bull.variants.bai_buu import BAI_BUU

BANKER, PLAYER_01, PLAYER_02, PLAYER_03 = bai_buu.SEATS


def hand(text: str) -> bai_buu.Hand:
    return bai_buu.make_hand(parse_cards(text, size=4))


def group(text: str) -> bai_buu.Group:
    a, b = parse_cards(text, size=2)
    return bai_buu.make_group(a, b)


def table(*hands: str) -> bai_buu.Deal:
    return bai_buu.deal_hands([parse_cards(h, size=4) for h in hands])


# ---------------------------------------------------------------------------
# Two-card groups (seed "Rules")


@pytest.mark.parametrize(
    ("cards", "category"),
    [
        ("9S AH", "points_9_5"),  # 9 and A: 9.5
        ("AH 9S", "points_9_5"),
        ("JS QH", "points_10"),  # two of J, Q, K: 10
        ("QS KD", "points_10"),
        ("JS TH", "points_0"),  # one of J, Q, K with a 10: 0
        ("TC KD", "points_0"),
        ("8S 7H", "points_5"),  # 15: bigger than 9.5, subtract 10
        ("KS 5H", "points_5"),  # J/Q/K count 10
        ("4S 5H", "points_9"),
        ("AS 2H", "points_3"),  # A counts 1
        ("TS 9H", "points_9"),
        ("2S 8H", "points_0"),
        ("5S 5H", "pair_5"),
        ("AS AD", "pair_A"),
        ("TS TD", "pair_T"),
    ],
)
def test_group_values(cards: str, category: str) -> None:
    assert group(cards).category == category


def test_pairs_beat_non_pairs_and_rank_two_to_ace() -> None:
    order = ["2", "3", "4", "5", "6", "7", "8", "9", "T", "J", "Q", "K", "A"]
    pairs = [group(f"{r}S {r}H") for r in order]
    for weaker, stronger in itertools.pairwise(pairs):
        assert bai_buu.compare_groups(stronger, weaker) == 1
    assert bai_buu.compare_groups(group("2S 2H"), group("JS QH")) == 1  # lowest pair > top non-pair


def test_special_points_order() -> None:
    ten, nine_half, nine, zero = group("JS KH"), group("9S AH"), group("4S 5H"), group("QS TH")
    assert bai_buu.compare_groups(ten, nine_half) == 1
    assert bai_buu.compare_groups(nine_half, nine) == 1
    assert bai_buu.compare_groups(nine, zero) == 1


def test_equal_points_tie() -> None:
    assert bai_buu.compare_groups(group("3S 4H"), group("2D 5C")) == 0
    assert bai_buu.compare_groups(group("JS TH"), group("2D 8C")) == 0  # both 0


# ---------------------------------------------------------------------------
# Hands and the head/last table

# Banker: head 5, last 7. Player heads and lasts that win, tie or lose against them.
BANKER_PLAIN = "2S 3H 2D 5C"
PLAYER_HEAD = {"win": "3S 4D", "tie": "4H AS", "lose": "AH 3C"}
PLAYER_LAST = {"win": "8D AC", "tie": "3D 4C", "lose": "7H 8S"}
SEED_TABLE = [  # the seed's table, read from the player's side
    ("win", "win", "win"),
    ("win", "tie", "win"),
    ("win", "lose", "tie"),
    ("tie", "win", "win"),
    ("tie", "tie", "tie"),
    ("tie", "lose", "lose"),
    ("lose", "win", "tie"),
    ("lose", "tie", "lose"),
    ("lose", "lose", "lose"),
]
RESULT = {"win": 1, "tie": 0, "lose": -1}


@pytest.mark.parametrize(("head", "last", "expected"), SEED_TABLE)
def test_head_last_table(head: str, last: str, expected: str) -> None:
    player = hand(f"{PLAYER_HEAD[head]} {PLAYER_LAST[last]}")
    banker = hand(BANKER_PLAIN)
    d = bai_buu.duel(player, banker)
    assert (d.head, d.last) == (RESULT[head], RESULT[last])
    assert d.result == RESULT[expected]
    assert bai_buu.duel(banker, player).result == -RESULT[expected]
    assert bai_buu.combine(RESULT[head], RESULT[last]) == RESULT[expected]


def test_four_of_a_kind_beats_three_of_a_kind_beats_the_rest() -> None:
    four = hand("2S 2H 2C 2D")  # groups: two pairs of 2s
    three = hand("3S 3H 3C 4D")
    plain = hand("AS AH KS KH")  # two pairs of higher rank, not a special
    assert bai_buu.compare(four, three) == 1
    assert bai_buu.compare(three, plain) == 1
    assert bai_buu.compare(four, plain) == 1
    assert bai_buu.duel(three, plain).decided_by == "three_of_a_kind"
    assert four.category == "four_of_a_kind" and three.category == "three_of_a_kind" and plain.category == "plain"


def test_two_specials_are_decided_by_points() -> None:
    assert bai_buu.compare(hand("3S 3H 3C 3D"), hand("2S 2H 2C 2D")) == 1  # pair 3 > pair 2 twice
    high = hand("9S 9H 9C AD")  # pair 9, then 9 + A = 9.5
    low = hand("KS KH KC 4D")  # pair K, then K + 4 = 4
    assert bai_buu.duel(high, low).result == 0  # head lose, last win: tie
    assert bai_buu.duel(hand("KS KH KC 9D"), hand("QS QH QC 8D")).result == 1


# ---------------------------------------------------------------------------
# Half prize

HALF = bai_buu.DEFAULT_CONFIG


def test_half_prize_when_winner_wins_a_group_with_six() -> None:
    banker = hand("2S 4H 8C 7D")  # head 6, last 5
    player = hand("5H 9C 8H 7S")  # head 4, last 5
    d = bai_buu.duel(banker, player, HALF)
    assert (d.result, d.head, d.last, d.half_prize) == (1, 1, 0, True)


def test_no_half_prize_when_the_six_group_only_tied() -> None:
    banker = hand("2S 4H 9C 9D")  # head 6, last pair of 9s
    player = hand("AS 5H 8H 7S")  # head 6 (tie), last 5 (the banker's pair wins)
    d = bai_buu.duel(banker, player, HALF)
    assert (d.result, d.head, d.last, d.half_prize) == (1, 0, 1, False)


def test_no_half_prize_for_the_losers_six_or_a_pair_of_threes() -> None:
    assert not bai_buu.duel(hand("8S AH 9C KD"), hand("2S 4H AS 2C"), HALF).half_prize  # loser's 6
    assert not bai_buu.duel(hand("3S 3H 8D AC"), hand("2S 2H 7H 8S"), HALF).half_prize  # pair of 3s


def test_no_half_prize_for_a_win_by_special() -> None:
    d = bai_buu.duel(hand("7S 7H 7C 9D"), hand("8S 9H KC QD"), HALF)  # last 7 + 9 = 6
    assert d.decided_by == "three_of_a_kind" and d.result == 1 and not d.half_prize


def test_half_prize_between_two_three_of_a_kinds() -> None:
    d = bai_buu.duel(hand("8S 8H 8C 8D"), hand("QS QH 5C 5D"), HALF)
    assert d.decided_by == "four_of_a_kind" and not d.half_prize
    d = bai_buu.duel(hand("7S 7H 7C 9D"), hand("4S 4H 4C 5D"), HALF)  # pair 7 > pair 4; 6 > 9? no
    assert d.result == 0  # head win, last lose (6 < 9)
    d = bai_buu.duel(hand("7S 7H 7C 9D"), hand("4S 4H 4C AD"), HALF)  # last 6 > 5
    assert (d.result, d.half_prize) == (1, True)


def test_half_prize_can_be_disabled_or_moved() -> None:
    banker, player = hand("2S 4H 8C 7D"), hand("5H 9C 8H 7S")
    assert not bai_buu.duel(banker, player, bai_buu.load_config({"half_prize": "false"})).half_prize
    assert not bai_buu.duel(banker, player, bai_buu.load_config({"half_prize_points": 5})).half_prize


# ---------------------------------------------------------------------------
# The seed's settlement examples (amounts in the seed: 100 on main bets, $1.00 jackpots)

STAKE = 10_000  # 100.00
JACKPOT = 100  # 1.00


def _nets(s: money.Settlement) -> dict[str, int]:
    return {b.bet_id: b.net_minor for b in s.bets}


def test_seed_example_1() -> None:
    deal = table("7S 7H 7C 2D", "2S 3H 8C JD", "5S 5H 5C 3D", "KS KH KC 9D")
    results = {seat: bai_buu.duel(deal.banker, deal.hand(seat)).result for seat in bai_buu.PLAYER_SEATS}
    assert results == {PLAYER_01: 1, PLAYER_02: 1, PLAYER_03: -1}  # Banker(01), Banker(02), Player(03)
    assert [seat for seat in bai_buu.SEATS if deal.hand(seat).jackpot] == [BANKER, PLAYER_02, PLAYER_03]
    bets = [
        bai_buu.Bet("banker 01", "u", "banker_01", STAKE),
        bai_buu.Bet("player 01", "u", "player_01", STAKE),
    ]
    jackpots = [
        bai_buu.Bet("jackpot player 01", "u", "jackpot_player_01", JACKPOT),
        bai_buu.Bet("jackpot player 02", "u", "jackpot_player_02", JACKPOT),
    ]
    s = bai_buu.settle(deal, bets, jackpots, 0)
    assert _nets(s) == {
        "banker 01": 10_000,  # 100
        "player 01": -10_000,  # -100
        "jackpot player 01": -100,  # -1.00
        "jackpot player 02": 4_900,  # 50 for 1: 49.00
    }


def test_seed_example_2() -> None:
    """Tie(01), Banker(02) with half prize, and Player 03's bet winning 100.

    The seed's result column says "Banker(03)" but its settlement line shows the
    Player 03 bet winning +100; both cannot hold. We reproduce every settlement
    line, so here Player 03 beats the banker (test below: the other reading).
    """
    deal = table("2S 4H 8C 7D", "3S 4C 9H 5S", "5H 9C 8H 7S", "3D 5D 6C 3H")
    d = {seat: bai_buu.duel(deal.banker, deal.hand(seat)) for seat in bai_buu.PLAYER_SEATS}
    assert d[PLAYER_01].result == 0
    assert (d[PLAYER_02].result, d[PLAYER_02].half_prize) == (1, True)
    assert (d[PLAYER_03].result, d[PLAYER_03].half_prize) == (-1, False)
    assert not any(deal.hand(seat).jackpot for seat in bai_buu.SEATS)
    bets = [
        bai_buu.Bet("banker 02", "u", "banker_02", STAKE),
        bai_buu.Bet("player 03", "u", "player_03", STAKE),
        bai_buu.Bet("player 02", "u", "player_02", STAKE),
        bai_buu.Bet("player 01", "u", "player_01", STAKE),
    ]
    jackpots = [
        bai_buu.Bet("jackpot banker", "u", "jackpot_banker", JACKPOT),
        bai_buu.Bet("jackpot player 02", "u", "jackpot_player_02", JACKPOT),
    ]
    s = bai_buu.settle(deal, bets, jackpots, 0)
    assert _nets(s) == {
        "banker 02": 5_000,  # half prize: 50
        "player 03": 10_000,  # 100
        "player 02": -10_000,  # -100
        "player 01": 0,  # tie: stake back
        "jackpot banker": -100,
        "jackpot player 02": -100,
    }
    outcomes = {b.bet_id: b.outcome for b in s.bets}
    assert outcomes["banker 02"] is money.Outcome.HALF_WIN
    assert outcomes["player 01"] is money.Outcome.PUSH


def test_seed_example_2_result_column_reading() -> None:
    """If the banker beats Player 03 (the result column), Player 03 loses -100."""
    deal = table("2S 4H 8C 7D", "3S 4C 9H 5S", "5H 9C 8H 7S", "3D AD 6C 9S")  # P03: head 4, last 5
    bets = [bai_buu.Bet("p3", "u", "player_03", STAKE), bai_buu.Bet("b3", "u", "banker_03", STAKE)]
    assert _nets(bai_buu.settle(deal, bets, [], 0)) == {"p3": -10_000, "b3": 5_000}  # banker won its head with 6


# ---------------------------------------------------------------------------
# Jackpot


def test_jackpot_flush_and_three_of_a_kind_pay_from_the_house() -> None:
    deal = table("2H 5H 9H KH", "4S 4H 4C 9D", "2S 3S 8C JD", "QS QH KC 9C")
    jackpots = [
        bai_buu.Bet("flush", "u", "jackpot_banker", JACKPOT),
        bai_buu.Bet("three", "v", "jackpot_player_01", JACKPOT),
        bai_buu.Bet("none", "w", "jackpot_player_02", JACKPOT),
    ]
    s = bai_buu.settle(deal, [], jackpots, 5_000)
    assert _nets(s) == {"flush": 1_900, "three": 4_900, "none": -100}
    net = s.net_by_party()
    assert net[money.JACKPOT_POOL] == 30  # 10% of three stakes
    assert net[money.HOUSE] == 270 - 2_000 - 5_000
    assert bai_buu.pool_after(s, 5_000) == 5_030


BY_HANDS = bai_buu.load_config({"jackpot.split": "hands"})
NO_FLOOR = {"jackpot.four_of_a_kind_floor": "false"}
QUADS = ("9S 9H 9C 9D", "2S 2H 2C 2D", "3S 4H 8C JD", "QS QH KC 7C")  # banker and player 01 hold four


def test_four_of_a_kind_split_hands_then_bets() -> None:
    """``jackpot.split=hands``: equally between the hands holding four of a kind, then the bets on each."""
    deal = table(*QUADS)
    jackpots = [
        bai_buu.Bet("a", "u", "jackpot_banker", JACKPOT),
        bai_buu.Bet("b", "v", "jackpot_player_01", JACKPOT),
        bai_buu.Bet("c", "w", "jackpot_player_01", JACKPOT),
        bai_buu.Bet("d", "x", "jackpot_player_02", JACKPOT),
    ]
    pool = 100_001 - 40  # plus this round's four contributions of 10: 100 001
    s = bai_buu.settle(deal, [], jackpots, pool, BY_HANDS)
    nets = _nets(s)
    assert nets["a"] == 50_000 - 100  # half the pool (100 001 // 2)
    assert nets["b"] == nets["c"] == 25_000 - 100  # the other half, between two bets
    assert nets["d"] == -100
    assert bai_buu.pool_after(s, pool) == 1  # 100 001 - 50 000 - 2 x 25 000 stays in the pool
    assert sorted(s.remainders) == [("a", 1, 2), ("b", 1, 4), ("c", 1, 4)]
    payouts = [t for t in s.transfers if t.kind is money.TransferKind.JACKPOT_PAYOUT]
    assert {t.payer for t in payouts} == {money.JACKPOT_POOL}


def test_four_of_a_kind_split_among_winning_bets_by_default() -> None:
    """the pool is split among the winning bets, equally (= pro rata: the stake is fixed)."""
    deal = table(*QUADS)
    jackpots = [
        bai_buu.Bet("a", "u", "jackpot_banker", JACKPOT),
        bai_buu.Bet("b", "v", "jackpot_player_01", JACKPOT),
        bai_buu.Bet("c", "w", "jackpot_player_01", JACKPOT),
        bai_buu.Bet("d", "x", "jackpot_player_02", JACKPOT),
    ]
    pool = 100_001 - 40
    s = bai_buu.settle(deal, [], jackpots, pool)
    nets = _nets(s)
    assert nets["a"] == nets["b"] == nets["c"] == 33_333 - 100 and nets["d"] == -100
    assert bai_buu.pool_after(s, pool) == 2
    assert sorted(s.remainders) == [("a", 2, 3), ("b", 2, 3), ("c", 2, 3)]


def test_a_sole_winning_bet_takes_the_whole_pool() -> None:
    """the unbet player 01's four of a kind no longer keeps half of the pool back."""
    deal = table(*QUADS)
    one = [bai_buu.Bet("a", "u", "jackpot_banker", JACKPOT)]
    s = bai_buu.settle(deal, [], one, 99_990)
    assert _nets(s) == {"a": 100_000 - 100}
    assert bai_buu.pool_after(s, 99_990) == 0
    by_hands = bai_buu.settle(deal, [], one, 99_990, BY_HANDS)
    assert _nets(by_hands) == {"a": 50_000 - 100}
    assert bai_buu.pool_after(by_hands, 99_990) == 50_000


def test_four_of_a_kind_never_pays_less_than_three_of_a_kind() -> None:
    """with an empty pool a four of a kind nets +49.00 (the floor), not -0.90."""
    deal = table(*QUADS)
    one = [bai_buu.Bet("a", "u", "jackpot_banker", JACKPOT)]
    s = bai_buu.settle(deal, [], one, 0)
    assert _nets(s) == {"a": 5_000 - 100}
    moves = sorted((t.payer, t.amount_minor) for t in s.transfers if t.kind is money.TransferKind.JACKPOT_PAYOUT)
    assert moves == [(money.HOUSE, 4_990), (money.JACKPOT_POOL, 10)]  # the pool's 0.10, the house the rest
    no_floor = bai_buu.settle(deal, [], one, 0, bai_buu.load_config(NO_FLOOR))
    assert _nets(no_floor) == {"a": 10 - 100}
    assert bai_buu.four_of_a_kind_floor_minor(JACKPOT, bai_buu.DEFAULT_CONFIG) == 5_000


def test_a_four_of_a_kind_paid_less_than_its_stake_is_recorded_and_announced_as_a_loss() -> None:
    """With the floor off, a four of a kind on an empty pool is paid the pool's 0.10 for a 1.00
    stake: the bettor nets -0.90, so the bet is a LOSS and the area is announced as one."""
    deal = table(*QUADS)
    one = [bai_buu.Bet("a", "u", "jackpot_banker", JACKPOT)]
    config = bai_buu.load_config(NO_FLOOR)
    (result,) = bai_buu.settle(deal, [], one, 0, config).bets
    assert result.net_minor == -90 and result.outcome is money.Outcome.LOSS
    rich = bai_buu.settle(deal, [], one, 10_000, config)
    assert rich.bets[0].net_minor > 0 and rich.bets[0].outcome is money.Outcome.WIN
    hands = {
        seat: SeatHand(seat, deal.hand(seat).cards, deal.hand(seat).category, 0, config.odds) for seat in bai_buu.SEATS
    }
    settlement = BAI_BUU.settle(hands, [TableBet("a", "u", "jackpot_banker", JACKPOT)], config, Funding())
    assert BAI_BUU.area_outcomes(hands, config, settlement)["jackpot_banker"] == "loss"


def test_the_house_seeds_the_pool_and_resets_it_after_a_hit() -> None:
    """seed and reset amounts, funded by the house with ``jackpot_seed`` transfers."""
    config = bai_buu.load_config({"jackpot.seed_minor": 10_000, "jackpot.reset_minor": 20_000})
    bet = [bai_buu.Bet("a", "u", "jackpot_banker", JACKPOT)]
    quiet = bai_buu.settle(table("2S 5H 9C KH", "4S 6H 8C 9D", "2H 3S 8D JD", "QS QH KC 7C"), [], bet, 0, config)
    assert not [t for t in quiet.transfers if t.kind is money.TransferKind.JACKPOT_SEED]  # no payout: no house money
    assert bai_buu.pool_after(quiet, 0) == 10
    first = bai_buu.settle(table(*QUADS), [], bet, 90, config)  # 0.90 + 0.10 in the pool, the seed is 100.00
    seeds = [t for t in first.transfers if t.kind is money.TransferKind.JACKPOT_SEED]
    assert [(t.payer, t.payee, t.amount_minor, t.bet_id) for t in seeds] == [
        (money.HOUSE, money.JACKPOT_POOL, 9_900, None),  # up to the seed before paying
        (money.HOUSE, money.JACKPOT_POOL, 20_000, None),  # the reset after paying
    ]
    assert _nets(first) == {"a": 10_000 - 100}
    assert bai_buu.pool_after(first, 90) == 20_000
    hit = bai_buu.settle(table(*QUADS), [], bet, 25_000, config)  # above the seed: nothing added first
    assert _nets(hit) == {"a": 25_010 - 100}
    refill = [t.amount_minor for t in hit.transfers if t.kind is money.TransferKind.JACKPOT_SEED]
    assert refill == [20_000]  # the pool is emptied, then restored to the reset amount
    assert bai_buu.pool_after(hit, 25_000) == 20_000
    assert bai_buu.load_config({"jackpot.seed_minor": 700}).jackpot_reset_minor == 700  # reset defaults to seed
    assert bai_buu.settle(table(*QUADS), [], [], 0, config).transfers == ()  # no jackpot bets: no seeding
    with pytest.raises(ConfigError) as info:
        bai_buu.load_config({"jackpot.seed_minor": 700, "jackpot.reset_minor": 600})
    assert info.value.key == "jackpot.reset_minor"
    assert bai_buu.load_config(bai_buu.config_settings(config)) == config


def test_jackpot_stake_is_fixed() -> None:
    deal = bai_buu.deal(DECK_52)
    with pytest.raises(bai_buu.BetError, match="jackpot costs exactly 100"):
        bai_buu.settle(deal, [], [bai_buu.Bet("a", "u", "jackpot_banker", 200)], 0)
    with pytest.raises(bai_buu.BetError, match="not a jackpot area"):
        bai_buu.settle(deal, [], [bai_buu.Bet("a", "u", "banker_01", 100)], 0)


# ---------------------------------------------------------------------------
# Deal, config, holds


def test_deal_convention() -> None:
    deal = bai_buu.deal(DECK_52)  # unshuffled: AS 2S 3S ... KS AH ...
    assert [c.code for c in deal.banker.cards] == ["AS", "2S", "3S", "4S"]
    assert [c.code for c in deal.hand(PLAYER_03).cards] == ["KS", "AH", "2H", "3H"]
    assert deal.banker.head.cards[0].code == "AS" and deal.banker.last.cards[0].code == "3S"
    with pytest.raises(CardError):
        bai_buu.deal(DECK_52[:51])
    with pytest.raises(CardError):
        bai_buu.deal((DECK_52[0], *DECK_52[:51]))


def test_config_defaults_and_errors() -> None:
    config = bai_buu.load_config({})
    assert config == bai_buu.DEFAULT_CONFIG
    assert config.odds == 2 and config.half_prize_points == 6 and config.jackpot_stake_minor == 100
    assert (config.jackpot_pay_three_of_a_kind, config.jackpot_pay_flush) == (Fraction(50), Fraction(20))
    nested = bai_buu.load_config({"jackpot": {"pay": {"flush": "15"}, "pool_share_bps": 500}, "odds": "1.95"})
    assert nested.jackpot_pay_flush == 15 and nested.jackpot_pool_share_bps == 500
    assert nested.odds == Fraction(39, 20)
    assert bai_buu.load_config(bai_buu.config_settings(nested)) == nested
    for key, value in [
        ("odds", "0.5"),
        ("half_prize_points", "10"),
        ("jackpot.stake_minor", "0"),
        ("jackpot.pay.flush", "x"),
        ("jackpot.pool_share_bps", "10001"),
        ("half_prize", "maybe"),
        ("jackpot.pay.four_of_a_kind", "1"),
    ]:
        with pytest.raises(ConfigError) as info:
            bai_buu.load_config({key: value})
        assert info.value.key == key


def test_hold_is_the_stake() -> None:
    assert bai_buu.hold_minor(bai_buu.Bet("a", "u", "player_02", 1234)) == 1234


def test_odd_stake_half_prize_rounds_toward_the_house() -> None:
    deal = table("2S 4H 8C 7D", "3S 4C 9H 5S", "5H 9C 8H 7S", "3D 5D 6C 3H")
    s = bai_buu.settle(deal, [bai_buu.Bet("b2", "u", "banker_02", 101)], [], 0)
    assert _nets(s) == {"b2": 50}
    assert s.remainders == (("b2", 1, 2),)


# ---------------------------------------------------------------------------
# Properties

card_sets = st.permutations(DECK_52).map(lambda deck: deck[:8])


@given(st.permutations(DECK_52))
@settings(max_examples=200, deadline=None)
def test_group_order_is_total_and_follows_categories(deck: list[Card]) -> None:
    groups = [bai_buu.make_group(deck[i], deck[i + 1]) for i in range(0, 12, 2)]
    rank = {category: i for i, category in enumerate(bai_buu.GROUP_CATEGORIES)}  # strongest first
    for a, b in itertools.product(groups, repeat=2):
        expected = (rank[a.category] < rank[b.category]) - (rank[a.category] > rank[b.category])
        assert bai_buu.compare_groups(a, b) == expected == -bai_buu.compare_groups(b, a)
    for a, b, c in itertools.permutations(groups, 3):
        if bai_buu.compare_groups(a, b) >= 0 and bai_buu.compare_groups(b, c) >= 0:
            assert bai_buu.compare_groups(a, c) >= 0


@given(card_sets)
@settings(max_examples=300, deadline=None)
def test_duel_is_antisymmetric_and_specials_dominate(cards: list[Card]) -> None:
    a, b = bai_buu.make_hand(cards[:4]), bai_buu.make_hand(cards[4:])
    ab, ba = bai_buu.duel(a, b), bai_buu.duel(b, a)
    assert ab.result == -ba.result and ab.half_prize == ba.half_prize and ab.decided_by == ba.decided_by
    if a.special != b.special:
        assert ab.result == (1 if a.special > b.special else -1)
    if ab.half_prize:
        winner = a if ab.result == 1 else b
        assert any(g.has_points(6) for g in (winner.head, winner.last))


configs = st.builds(
    bai_buu.BaiBuuConfig,
    odds=st.fractions(min_value=1, max_value=5, max_denominator=40),
    half_prize=st.booleans(),
    half_prize_points=st.integers(0, 9),
    jackpot_stake_minor=st.just(100),
    jackpot_pay_three_of_a_kind=st.fractions(min_value=0, max_value=100, max_denominator=7),
    jackpot_pay_flush=st.fractions(min_value=0, max_value=100, max_denominator=7),
    jackpot_pool_share_bps=st.integers(0, 10_000),
)


@st.composite
def rounds(draw: st.DrawFn) -> tuple[bai_buu.Deal, list[bai_buu.Bet], list[bai_buu.Bet], int, bai_buu.BaiBuuConfig]:
    config = draw(configs)
    deal = bai_buu.deal(draw(st.permutations(DECK_52)))
    players = ["u", "v", "w"]
    main = draw(st.lists(st.tuples(st.sampled_from(bai_buu.MAIN_AREAS), st.integers(1, 10**7)), max_size=8))
    jack = draw(st.lists(st.sampled_from(bai_buu.JACKPOT_AREAS), max_size=6))
    bets = [bai_buu.Bet(f"m{i}", players[i % 3], area, stake) for i, (area, stake) in enumerate(main)]
    jackpots = [bai_buu.Bet(f"j{i}", players[i % 3], area, config.jackpot_stake_minor) for i, area in enumerate(jack)]
    return deal, bets, jackpots, draw(st.integers(0, 10**9)), config


@given(rounds())
@settings(max_examples=300, deadline=None)
def test_settlement_conserves_money(
    case: tuple[bai_buu.Deal, list[bai_buu.Bet], list[bai_buu.Bet], int, bai_buu.BaiBuuConfig],
) -> None:
    deal, bets, jackpots, pool, config = case
    s = bai_buu.settle(deal, bets, jackpots, pool, config).check()
    net = s.net_by_party()
    assert sum(net.values()) == 0
    assert bai_buu.pool_after(s, pool) >= 0
    assert all(-b.net_minor <= b.hold_minor == b.stake_minor for b in s.bets)
    by_player = Counter[str]()
    for b in s.bets:
        by_player[b.player] += b.net_minor
    for player, amount in by_player.items():
        assert net.get(player, 0) == amount
    for t in s.transfers:
        assert t.bet_id is not None


# ---------------------------------------------------------------------------
# Census against independent derivations


def _independent_group_counts() -> dict[str, int]:
    """Counted from the rule text with suit multiplicities, not through the rules module."""
    counts: Counter[str] = Counter()
    names = "A23456789TJQK"
    for i, j in itertools.combinations_with_replacement(range(13), 2):
        a, b = names[i], names[j]
        if a == b:
            counts[f"pair_{a}"] += math.comb(4, 2)
            continue
        faces = {"J", "Q", "K"}
        value = {n: (k + 1 if k < 9 else 10) for k, n in enumerate(names)}
        if {a, b} == {"9", "A"}:
            key = "points_9_5"
        elif {a, b} <= faces:
            key = "points_10"
        elif len({a, b} & faces) == 1 and "T" in {a, b}:
            key = "points_0"
        else:
            key = f"points_{(value[a] + value[b]) % 10}"
        counts[key] += 16
    return dict(counts)


def test_group_census() -> None:
    census = bm.group_census()
    assert sum(census.values()) == math.comb(52, 2) == 1326
    assert census == {k: _independent_group_counts().get(k, 0) for k in bai_buu.GROUP_CATEGORIES}
    assert census["points_9_5"] == 16 and census["points_10"] == 48 and census["points_0"] == 96


hand_census = functools.cache(bm.hand_census)


def test_hand_census() -> None:
    census = hand_census()
    assert sum(census.values()) == math.comb(52, 4) == 270_725
    assert census["four_of_a_kind"] == 13
    assert census["three_of_a_kind"] == 13 * math.comb(4, 3) * 48
    assert census["flush"] == 4 * math.comb(13, 4)
    assert census["plain"] == 270_725 - 13 - 2496 - 2860


def test_exact_duel_enumeration_covers_every_deal_and_is_symmetric() -> None:
    counts = bm.duel_counts(6)
    assert counts.total == bm.DUELS_TOTAL == 1326 * 1225 * 1128 * 1035
    assert (counts.banker_full, counts.banker_half) == (counts.player_full, counts.player_half)
    rtp = bm.main_bet_rtp(bai_buu.DEFAULT_CONFIG, {6: counts})
    assert rtp["player"] == 1 - Fraction(counts.player_half, 2 * counts.total)
    off = bm.main_bet_rtp(bai_buu.load_config({"half_prize": False}), {6: counts})
    assert off == {"banker": 1, "player": 1}
    # Frequencies from the real duel function on random deals agree with the enumeration.
    rng = np.random.default_rng(5)
    n = 6000
    seen: Counter[str] = Counter()
    for _ in range(n):
        idx = rng.choice(52, 8, replace=False)
        a = bai_buu.make_hand([DECK_52[i] for i in idx[:4]])
        b = bai_buu.make_hand([DECK_52[i] for i in idx[4:]])
        d = bai_buu.duel(a, b)
        seen[{1: "banker", 0: "tie", -1: "player"}[d.result] + ("_half" if d.half_prize else "")] += 1
    expected = {
        "banker": counts.banker_full,
        "banker_half": counts.banker_half,
        "tie": counts.tie,
        "player": counts.player_full,
        "player_half": counts.player_half,
    }
    for key, count in expected.items():
        p = count / counts.total
        assert abs(seen[key] / n - p) < 5 * math.sqrt(p * (1 - p) / n), key


def test_jackpot_rtp() -> None:
    rtp = bm.jackpot_rtp(bai_buu.DEFAULT_CONFIG, hand_census())
    assert rtp["pay_table"] == Fraction(2496 * 50 + 2860 * 20, 270_725)
    assert rtp["total"] == rtp["pay_table"] + Fraction(1, 10)
