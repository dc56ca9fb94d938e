"""Hundred-player Bull with jokers: rule-text examples, census against brute force, order, money, dealing."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from itertools import pairwise
from math import comb

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bull.analysis import baibian_bull_math as bbm
from bull.analysis import fast
from bull.cards import BIG_JOKER, DECK_54, SMALL_JOKER, Card, CardError, parse_card, parse_cards
from bull.money import Outcome
from bull.rules import baibian_bull as bb
from bull.rules.baibian_bull import BaibianBullConfig, Bet, Category
from bull.rules.config import ConfigError

Array = npt.NDArray[np.int64]


def hand(text: str) -> bb.BaibianHand:
    return bb.evaluate(parse_cards(text))


# --------------------------------------------------------------------------- rule-text examples


@pytest.mark.parametrize(
    ("cards", "category"),
    [
        ("AS AH AC AD 9S", Category.BOMB),  # AAAAX
        ("KS KH KD KC 2S", Category.BOMB),  # KKKKX
        ("7S 7H 7D BJ 2S", Category.BOMB),  # a joker completes the four
        ("7S 7H SJ BJ 2S", Category.BOMB),
        ("JS QS KS JH QH", Category.GOLD),  # five J/Q/K
        ("JS QS KS JH SJ", Category.GOLD),  # the joker stands for a face
        ("JS QS KS JH TH", Category.SILVER),  # four J/Q/K and a 10
        ("JS QS KS BJ TH", Category.SILVER),  # the joker is the fourth face
        ("JS QS KS JH 9H", Category.BULL_9),  # four faces and a 9 is an ordinary Bull 9
        ("3S 7H KD 5C 5D", Category.BULL_BULL),
        ("3S 7H KD 5C BJ", Category.BULL_BULL),  # the joker makes the pair a multiple of 10
        ("2S 8H TD 9C 8D", Category.BULL_7),  # 后牛 17 -> Bull 7
        ("AS 9H 2C 2D 3S", Category.NO_BULL),  # A+9 = 10 is two cards: a bull needs three
        ("AS 9H 2C 2D BJ", Category.BULL_BULL),  # 2+2+joker(6) = 10 leaves A+9 = 10
        ("AS 2H 4C 6D 3S", Category.BULL_6),  # A+3+6 = 10, 2+4 = 6
    ],
)
def test_categories_from_the_rule_text(cards: str, category: Category) -> None:
    assert hand(cards).category is category


def test_jokers_make_the_strongest_bull_bull() -> None:
    """注: 有大王的是最大的牛牛，有小王的是第2."""
    big = hand("3S 7H KD 5C BJ")
    small = hand("3H 7D KC 5S SJ")
    plain = hand("3C 7C KS 5D 5H")
    assert big.category is small.category is plain.category is Category.BULL_BULL
    assert bb.compare(big, small) > 0 and bb.compare(small, plain) > 0
    assert bb.compare(small, hand("TS JS QS 2H 8H")) > 0  # beats every plain Bull Bull


def test_silver_with_the_big_joker_is_the_strongest_silver() -> None:
    """例如：兩家都是銀牛，其中一家有大王，也是銀牛中的最大的銀牛."""
    assert bb.compare(hand("JS QS KC BJ TH"), hand("KS KH QD JH TS")) > 0


def test_category_order_bomb_gold_silver_bull_bull() -> None:
    ladder = [hand("2S 2H 2C 2D 3S"), hand("JS JH QS QH KS"), hand("JD QD KD KC TD"), hand("3S 7H KH 5C BJ")]
    assert [h.category for h in ladder] == [Category.BOMB, Category.GOLD, Category.SILVER, Category.BULL_BULL]
    assert all(bb.compare(a, b) > 0 for a, b in pairwise(ladder))


def test_ties_break_on_highest_card_then_suit() -> None:
    assert bb.compare(hand("KS 2S 8H 5C 4C"), hand("QS 3H 7D 6D 3C")) > 0  # both Bull 9: K beats Q
    assert bb.compare(hand("KS 2S 8H 5C 4C"), hand("KH 3H 7D 6D 3C")) > 0  # K spades beats K hearts
    assert bb.compare(hand("KS QH 3C 4D 8S"), hand("KH QS 3D 4C 8H")) > 0  # No Bull: highest card, suit


def test_bad_hands() -> None:
    with pytest.raises(CardError, match="5 cards"):
        bb.evaluate(parse_cards("AS 2S 3S 4S"))
    with pytest.raises(CardError, match="duplicate"):
        bb.evaluate([*parse_cards("AS 2S 3S 4S"), parse_card("AS")])


# --------------------------------------------------------------------------- census and batch


def test_census_matches_brute_force(hands_54: Array, baibian_reference: Callable[[Array], Array]) -> None:
    expected = np.bincount(baibian_reference(hands_54), minlength=len(bb.CATEGORIES))
    counts = bbm.census()
    assert sum(counts.values()) == comb(54, 5)
    assert [counts[c] for c in bb.CATEGORIES] == expected.tolist()


def test_census_specials_by_formula() -> None:
    """Closed forms, by number of jokers j (2 ways to hold one joker).

    Bomb: j=0 four of a rank + any card; j=1 three or four of a rank among four
    plain cards; j=2 any pair among three plain cards. Gold: the C(14, 5) hands of
    faces and jokers only, minus those that are Bombs.
    """
    bombs = 13 * 48 + 2 * (13 * comb(4, 3) * 48 + 13) + (comb(52, 3) - comb(13, 3) * 4**3)
    face_bombs = 3 * 8 + 2 * (3 * comb(4, 3) * 8 + 3) + (comb(12, 3) - 4**3)
    counts = bbm.census()
    assert counts[Category.BOMB] == bombs
    assert counts[Category.GOLD] == comb(14, 5) - face_bombs


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(DECK_54), min_size=5, max_size=5, unique=True))
def test_scalar_and_batch_evaluation_agree(cards: list[Card]) -> None:
    batch = fast.evaluate_baibian_batch(np.array([[card.index for card in cards]]))
    assert int(batch[0]) == bb.evaluate(cards).strength
    by_four = BaibianBullConfig(bomb_order=bb.BombOrder.RANK_OF_FOUR)
    batch = fast.evaluate_baibian_batch(np.array([[card.index for card in cards]]), by_four)
    assert int(batch[0]) == bb.evaluate(cards, by_four).strength


# --------------------------------------------------------------------------- order properties

hands5 = st.lists(st.sampled_from(DECK_54), min_size=5, max_size=5, unique=True)


@settings(max_examples=300, deadline=None)
@given(hands5, hands5, hands5)
def test_compare_is_a_total_order(a: list[Card], b: list[Card], c: list[Card]) -> None:
    x, y, z = bb.evaluate(a), bb.evaluate(b), bb.evaluate(c)
    assert bb.compare(x, y) == -bb.compare(y, x) and bb.compare(x, x) == 0
    if bb.compare(x, y) >= 0 and bb.compare(y, z) >= 0:
        assert bb.compare(x, z) >= 0
    if x.category != y.category:
        assert (bb.compare(x, y) > 0) == (bb.LEVEL[x.category] > bb.LEVEL[y.category])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(DECK_54), min_size=10, max_size=10, unique=True))
def test_hands_from_one_deck_never_tie(cards: list[Card]) -> None:
    assert bb.compare(bb.evaluate(cards[:5]), bb.evaluate(cards[5:])) != 0


# --------------------------------------------------------------------------- money

AREA_HANDS = (
    parse_cards("4S 6H TD 5C 4C"),  # Bull 9, heaven
    parse_cards("AS 9H 2C 2D 3S"),  # No Bull, earth
    parse_cards("JS QS KS JH QH"),  # Gold, mystic
    parse_cards("4D 6D TC 3D 4H"),  # Bull 7, yellow
)


def test_settlement_multiplier_both_ways() -> None:
    banker = parse_cards("3C 7C KC 5D 5H")  # Bull Bull x10
    bets = [Bet(f"b{i}", f"p{i}", area, 100) for i, area in enumerate(bb.AREAS)]
    result = bb.settle(banker, AREA_HANDS, bets, banker_party="banker_7")
    assert [(b.outcome, b.net_minor) for b in result.bets] == [
        (Outcome.LOSS, -1000),
        (Outcome.LOSS, -1000),
        (Outcome.WIN, 1000),
        (Outcome.LOSS, -1000),
    ]
    assert result.net_by_party()["banker_7"] == 2000 and all(b.hold_minor == 1000 for b in result.bets)
    weak = parse_cards("5S 6S 9S 2H 3H")  # Bull 5 (5+6+9 = 20, 2+3 = 5)
    result = bb.settle(weak, AREA_HANDS, bets, banker_party="banker_7")
    assert [b.net_minor for b in result.bets] == [900, -500, 1000, 700]


deals = st.permutations(DECK_54).map(lambda deck: deck[:25])
multipliers = st.lists(
    st.builds(Fraction, st.integers(1, 30), st.sampled_from([1, 2, 3])), min_size=14, max_size=14
).map(tuple)


@settings(max_examples=200, deadline=None)
@given(deals, st.lists(st.tuples(st.sampled_from(bb.AREAS), st.integers(1, 10**9)), max_size=8), multipliers)
def test_settlement_conserves_money(
    cards: list[Card], bets: list[tuple[str, int]], values: tuple[Fraction, ...]
) -> None:
    config = BaibianBullConfig(values)
    hands = [cards[i : i + 5] for i in range(0, 25, 5)]
    placed = [Bet(f"b{i}", f"p{i % 3}", area, stake) for i, (area, stake) in enumerate(bets)]
    result = bb.settle(hands[0], hands[1:], placed, config, banker_party="banker")
    assert sum(result.net_by_party().values()) == 0
    for bet, outcome in zip(placed, result.bets, strict=True):
        assert -outcome.net_minor <= outcome.hold_minor == bb.hold_minor(bet.stake_minor, config)
        area = bb.evaluate(hands[1 + bb.AREAS.index(bet.area)])
        assert outcome.net_minor <= bb.net_exact(area, bb.evaluate(hands[0]), Fraction(bet.stake_minor), config)


@settings(max_examples=200, deadline=None)
@given(deals, st.integers(1, 10**9))
def test_swapping_banker_and_area_negates(cards: list[Card], stake: int) -> None:
    hands = [cards[i : i + 5] for i in range(0, 25, 5)]
    bet = [Bet("b", "p", "heaven", stake)]
    forward = bb.settle(hands[0], hands[1:], bet, banker_party="k").bets[0].net_minor
    backward = bb.settle(hands[1], [hands[0], *hands[2:]], bet, banker_party="k").bets[0].net_minor
    assert forward == -backward != 0


def test_config() -> None:
    config = BaibianBullConfig.from_settings({"multipliers.bomb": "12", "multipliers": {"no_bull": "1/2"}})
    assert config.multiplier(Category.BOMB) == 12 and config.multiplier(Category.NO_BULL) == Fraction(1, 2)
    assert BaibianBullConfig.from_settings(config.to_settings()) == config
    assert bb.hold_minor(100, config) == 1200
    for key, value in [("multipliers.bomb", "x"), ("multipliers.bomb", "0"), ("mode", "authentic")]:
        with pytest.raises(ConfigError) as error:
            BaibianBullConfig.from_settings({key: value})
        assert error.value.key == key


def test_settlement_errors() -> None:
    banker = parse_cards("3C 7C KC 5D 5H")
    with pytest.raises(ValueError, match="unknown area"):
        bb.settle(banker, AREA_HANDS, [Bet("b", "p", "area_1", 1)], banker_party="k")
    with pytest.raises(ValueError, match="itself"):
        bb.settle(banker, AREA_HANDS, [Bet("b", "k", "heaven", 1)], banker_party="k")


# --------------------------------------------------------------------------- dealing


@pytest.mark.parametrize(
    ("drawn", "seat"),
    [("AS", 0), ("2H", 1), ("3C", 2), ("4D", 3), ("5S", 4), ("6H", 0), ("9C", 3), ("TD", 4), ("JS", 4), ("KC", 4)],
)
def test_first_seat_from_the_rule_text(drawn: str, seat: int) -> None:
    """A -> banker, 2 -> 閑家1, ..., 5 -> 閑家4, 6 -> banker again; J/Q/K count 10 點 like the 10."""
    assert bb.first_seat(parse_card(drawn)) == seat


RANK_VALUES = BaibianBullConfig.from_settings({"deal.card_value": "rank"})


def test_first_seat_for_jokers_and_by_rank() -> None:
    # Interpretation: a joker "can be any 點數"; as the drawn card it counts 10, like the faces.
    assert bb.card_value(SMALL_JOKER) == bb.card_value(BIG_JOKER) == 10
    assert bb.first_seat(SMALL_JOKER) == bb.first_seat(BIG_JOKER) == 4
    # deal.card_value=rank: A=1 .. K=13, small joker 14, big joker 15 (an earlier reading).
    assert [bb.first_seat(parse_card(c), RANK_VALUES) for c in ("JS", "QS", "KC")] == [0, 1, 2]
    assert bb.first_seat(SMALL_JOKER, RANK_VALUES) == 3 and bb.first_seat(BIG_JOKER, RANK_VALUES) == 4
    deck = [parse_card("KC"), *(c for c in DECK_54 if c.code != "KC")]
    assert bb.deal(deck).first_seat == 4 and bb.deal(deck, RANK_VALUES).first_seat == 2
    assert BaibianBullConfig.from_settings(RANK_VALUES.to_settings()) == RANK_VALUES


def cards(text: str) -> list[Card]:
    return list(parse_cards(text))


def test_bombs_compare_by_highest_card_or_by_the_rank_of_the_four() -> None:
    """2222K beats QQQQ3 by the highest card (default); QQQQ3 wins by the rank of the four."""
    low, high = cards("2S 2H 2C 2D KS"), cards("QS QH QC QD 3S")
    assert bb.compare(bb.evaluate(low), bb.evaluate(high)) == 1
    by_four = BaibianBullConfig.from_settings({"bomb_order": "rank_of_four"})
    a, b = bb.evaluate(low, by_four), bb.evaluate(high, by_four)
    assert bb.compare(a, b) == -1 and a.category == b.category == Category.BOMB
    assert "rank of the four" in bb.explain(a, b)
    # A joker completes the highest four it can: 99 + both jokers + K is four 9s (K + 2 jokers is three).
    jokers = bb.evaluate([*cards("9S 9H KD"), SMALL_JOKER, BIG_JOKER], by_four)
    assert bb.four_rank([9, 9, 13], 2) == 9 and jokers.category == Category.BOMB
    assert bb.compare(jokers, bb.evaluate(cards("TS TH TC TD AS"), by_four)) == -1
    assert bb.compare(jokers, bb.evaluate(cards("8S 8H 8C 8D AS"), by_four)) == 1
    # Other categories do not change; settlement follows the config.
    assert bb.evaluate(cards("KS QS JS TS 9S"), by_four).strength == bb.evaluate(cards("KS QS JS TS 9S")).strength
    with pytest.raises(ConfigError):
        BaibianBullConfig.from_settings({"bomb_order": "suit"})


@given(st.permutations(DECK_54))
def test_deal_is_round_robin_from_the_first_seat(deck: list[Card]) -> None:
    dealt = bb.deal(deck)
    first = bb.first_seat(deck[0])
    assert dealt.burned == deck[0] and dealt.first_seat == first
    assert dealt.hands[first][0] == deck[1] and dealt.hands[(first + 1) % 5][0] == deck[2]
    assert all(len(h) == 5 for h in dealt.hands)
    assert {card for h in dealt.hands for card in h} == set(deck[1:26])
    assert dealt.hidden == tuple(h[4] for h in dealt.hands)
    assert dealt.hidden[(first + 4) % 5] == deck[25]  # the last card dealt is the last seat's hidden card
    assert bb.deal(deck) == dealt


def test_deal_rejects_a_wrong_deck() -> None:
    with pytest.raises(CardError):
        bb.deal(DECK_54[:52])


def test_monte_carlo_is_seeded_and_near_one() -> None:
    result = fast.simulate_baibian(bb.DEFAULT_CONFIG, 200_000, np.random.default_rng(3))
    assert abs(result.rtp - 1) < 5 * result.std_error
    assert fast.simulate_baibian(bb.DEFAULT_CONFIG, 200_000, np.random.default_rng(3)) == result


def test_exact_variance_counts_every_pair_of_disjoint_hands() -> None:
    """Each row of the pair counts is its category's census times the C(49,5) hands left to pair with,
    the table is symmetric, and the variance agrees with the report's Monte Carlo estimate."""
    joint = bbm.pair_category_counts()
    census = bbm.census()
    assert [sum(row) for row in joint] == [census[c] * comb(49, 5) for c in bb.CATEGORIES]
    assert all(joint[i][j] == joint[j][i] for i in range(len(joint)) for j in range(len(joint)))
    variance = bbm.exact_bet_variance()
    assert abs(float(variance) - 59.7776) < 1e-4
    assert bbm.exact_bet_variance(BaibianBullConfig(bomb_order=bb.BombOrder.RANK_OF_FOUR)) == variance
    flat = BaibianBullConfig(multipliers=tuple(Fraction(1) for _ in bb.CATEGORIES))
    assert bbm.exact_bet_variance(flat) == 1  # every bet nets +1 or -1
