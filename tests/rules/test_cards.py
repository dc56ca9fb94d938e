"""The card model and its canonical deck order (part of the provably-fair contract)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bull.cards import (
    BIG_JOKER,
    DECK_52,
    DECK_54,
    SMALL_JOKER,
    Card,
    CardError,
    Suit,
    card_from_index,
    check_distinct,
    deck,
    format_cards,
    parse_card,
    parse_cards,
)


def test_canonical_order_is_pinned() -> None:
    """Changing the deck order would change every verified deal: pin it by digest."""
    text = " ".join(card.code for card in DECK_54)
    assert text.startswith("AS 2S 3S 4S 5S 6S 7S 8S 9S TS JS QS KS AH")
    assert text.endswith("QD KD SJ BJ")
    assert (
        hashlib.sha256(text.encode()).hexdigest()
        == hashlib.sha256(" ".join(f"{r}{s}" for s in "SHCD" for r in "A23456789TJQK").encode() + b" SJ BJ").hexdigest()
    )


def test_index_round_trips_through_the_deck() -> None:
    assert [card.index for card in DECK_54] == list(range(54))
    assert all(card_from_index(card.index) is card for card in DECK_54)
    assert deck(52) == DECK_52 and deck(54) == DECK_54


@pytest.mark.parametrize(
    ("text", "rank", "suit"),
    [("AS", 1, Suit.S), ("td", 10, Suit.D), ("10H", 10, Suit.H), ("KC", 13, Suit.C), (" qh ", 12, Suit.H)],
)
def test_parse_card(text: str, rank: int, suit: Suit) -> None:
    assert parse_card(text) == Card(rank, suit)


def test_jokers() -> None:
    assert parse_card("SJ") is SMALL_JOKER and parse_card("bj") is BIG_JOKER
    assert SMALL_JOKER.is_joker and BIG_JOKER.bull_value == 0 and not BIG_JOKER.is_face
    assert (SMALL_JOKER.index, BIG_JOKER.index) == (52, 53)


def test_card_values_and_faces() -> None:
    assert [Card(rank, Suit.S).bull_value for rank in range(1, 14)] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 10, 10]
    assert [Card(rank, Suit.S).is_face for rank in (10, 11, 12, 13)] == [False, True, True, True]


@pytest.mark.parametrize("bad", ["", "1S", "AX", "ZZ", "11S", "AS2"])
def test_bad_cards_are_card_errors(bad: str) -> None:
    with pytest.raises(CardError, match="not a card"):
        parse_card(bad)


def test_parse_cards_rejects_duplicates_and_wrong_size() -> None:
    assert parse_cards("AS, TD QH") == (Card(1, Suit.S), Card(10, Suit.D), Card(12, Suit.H))
    with pytest.raises(CardError, match="duplicate card: AS"):
        parse_cards("AS KD AS")
    with pytest.raises(CardError, match="expected 5 cards"):
        parse_cards("AS KD", size=5)
    with pytest.raises(CardError):
        deck(53)
    with pytest.raises(CardError):
        card_from_index(54)


@given(st.lists(st.sampled_from(DECK_54), min_size=1, max_size=10, unique=True))
def test_format_and_parse_round_trip(cards: list[Card]) -> None:
    assert parse_cards(format_cards(cards)) == tuple(cards)
    check_distinct(cards)
