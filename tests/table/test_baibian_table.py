"""百變牛牛's table adapter: the deal convention and its inverse, the hidden fifth card, settings, caps."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bull.cards import DECK_54, parse_card
from bull.rules import baibian_bull as bb
from bull.rules.config import ConfigError
from bull.variants import VARIANTS, Funding, TableBet
from bull.variants.baibian_bull import (
    BAIBIAN_BULL,
    FACE_UP,
    OPEN,
    BaibianTableConfig,
    deal_facts,
    dealt_prefix,
)

decks = st.permutations(DECK_54)


def test_registered_with_a_54_card_deck_and_reveals_banker_last() -> None:
    assert VARIANTS["baibian_bull"] is BAIBIAN_BULL
    assert BAIBIAN_BULL.deck_size == 54 and BAIBIAN_BULL.cards_dealt == 26
    assert BAIBIAN_BULL.reveal_plan({}) == tuple(
        (seat, group) for group in (FACE_UP, OPEN) for seat in ("heaven", "earth", "mystic", "yellow", "banker")
    )


@settings(max_examples=200, deadline=None)
@given(decks)
def test_the_dealt_prefix_is_rebuilt_from_the_drawn_card_and_the_hands(deck: list) -> None:  # type: ignore[type-arg]
    config = BAIBIAN_BULL.parse_config({})
    hands = BAIBIAN_BULL.deal(deck, config)
    codes = {seat: [card.code for card in hand.cards] for seat, hand in hands.items()}
    assert dealt_prefix(deck[0].code, codes, config) == [card.code for card in deck[:26]]
    assert deal_facts(deck, config) == (deck[0].code, bb.SEATS[bb.first_seat(deck[0], config.rules)])
    for hand in hands.values():
        shown = BAIBIAN_BULL.reveal_part(hand, FACE_UP, config)
        assert shown.cards == hand.cards[:4] and hand.cards[4] not in shown.cards and shown.category == ""
        assert BAIBIAN_BULL.reveal_part(hand, OPEN, config) == hand
        assert hand.category == str(bb.evaluate(hand.cards).category)


def test_the_drawn_card_picks_the_first_seat() -> None:
    """By its 點數 (default): A -> banker, 2 -> Heaven, ... 5 -> Yellow, 6 -> banker again, 10/J/Q/K and the
    jokers 10 -> Yellow; with ``deal.card_value=rank``: K 13 -> Earth, small joker 14, big joker 15."""
    codes = ("AS", "2S", "3S", "4S", "5S", "6S", "KD", "SJ", "BJ")
    by_points = BAIBIAN_BULL.parse_config({})
    by_rank = BAIBIAN_BULL.parse_config({"deal.card_value": "rank"})
    assert [deal_facts([parse_card(c)], by_points)[1] for c in codes] == [
        "banker", "heaven", "earth", "mystic", "yellow", "banker", "yellow", "yellow", "yellow",
    ]  # fmt: skip
    assert [deal_facts([parse_card(c)], by_rank)[1] for c in codes] == [
        "banker", "heaven", "earth", "mystic", "yellow", "banker", "earth", "mystic", "yellow",
    ]  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(decks, st.lists(st.tuples(st.sampled_from(bb.AREAS), st.integers(1, 1000)), min_size=1, max_size=20))
def test_the_banker_pays_from_what_the_cap_lets_the_table_stake(deck: list, stakes: list) -> None:  # type: ignore[type-arg]
    config = BAIBIAN_BULL.parse_config({})
    hands = BAIBIAN_BULL.deal(deck, config)
    bets = [TableBet(f"b{i}", f"player:p{i}", area, 100 * n) for i, (area, n) in enumerate(stakes)]
    settlement = BAIBIAN_BULL.settle(hands, bets, config, Funding("player:bank", "banker.h"))
    paid = sum(t.amount_minor for t in settlement.transfers if t.payer == "player:bank")
    assert all(t.hold_id == "banker.h" for t in settlement.transfers if t.payer == "player:bank")
    staked = sum(b.stake_minor for b in bets)
    # The table cap is banker capital / 10: a banker holding capital C covers any stakes up to C / 10.
    capital = staked * 10
    assert config.cap_minor(capital) == staked and paid <= capital


def test_settings_round_trip_and_are_checked() -> None:
    config = BAIBIAN_BULL.parse_config({"base_score": "10", "banker.session_rounds": "5"})
    assert isinstance(config, BaibianTableConfig)
    assert config.chips_minor == (1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)
    assert BAIBIAN_BULL.parse_config(BAIBIAN_BULL.config_settings(config)) == config
    assert config.session_rounds == 5 and BAIBIAN_BULL.parse_config({}).session_rounds == 72
    assert config.cap_minor(1_000_009) == 100_000 and BAIBIAN_BULL.hold_multiplier(config) == Fraction(10)
    with pytest.raises(ConfigError, match="base_score"):
        BAIBIAN_BULL.parse_config({"base_score": "0"})
    with pytest.raises(ConfigError):
        BAIBIAN_BULL.parse_config({"banker.unknown": "1"})
