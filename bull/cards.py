"""Cards, decks and their text form.

A card is written as rank then suit: ``AS`` (ace of spades), ``TD`` (ten of
diamonds), ``QH``; the jokers are ``SJ`` (small) and ``BJ`` (big). ``10`` is
accepted as an alias for ``T`` when parsing.

The canonical deck order is the one the rng service shuffles from, so it is
part of the provably-fair contract and must never change: suits in the order
S, H, C, D, and within a suit ranks A, 2, ..., K; the 54-card deck appends the
small joker and then the big joker. ``Card.index`` is the position in that
order (0..53).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum


class CardError(ValueError):
    """A card or hand is malformed (bad text, duplicates, wrong size)."""


class Suit(IntEnum):
    """Suits in canonical deck order (not a strength order: that is configurable)."""

    S = 0
    H = 1
    C = 2
    D = 3


RANK_CHARS = "A23456789TJQK"
SMALL_JOKER_RANK = 14
BIG_JOKER_RANK = 15


@dataclass(frozen=True, slots=True)
class Card:
    """One card. ``rank`` is 1 (ace) .. 13 (king), 14 small joker, 15 big joker."""

    rank: int
    suit: Suit | None

    @property
    def is_joker(self) -> bool:
        return self.suit is None

    @property
    def index(self) -> int:
        if self.suit is None:
            return 52 if self.rank == SMALL_JOKER_RANK else 53
        return int(self.suit) * 13 + self.rank - 1

    @property
    def code(self) -> str:
        if self.suit is None:
            return "SJ" if self.rank == SMALL_JOKER_RANK else "BJ"
        return RANK_CHARS[self.rank - 1] + self.suit.name

    @property
    def is_face(self) -> bool:
        """J, Q or K."""
        return self.suit is not None and self.rank >= 11

    @property
    def bull_value(self) -> int:
        """Value for bull sums: A=1, 2..9 face value, 10/J/Q/K = 10 (jokers: 0, they are wild)."""
        if self.suit is None:
            return 0
        return min(self.rank, 10)

    def __str__(self) -> str:
        return self.code

    def __repr__(self) -> str:
        return f"Card({self.code})"


DECK_52: tuple[Card, ...] = tuple(Card(rank, suit) for suit in Suit for rank in range(1, 14))
SMALL_JOKER = Card(SMALL_JOKER_RANK, None)
BIG_JOKER = Card(BIG_JOKER_RANK, None)
DECK_54: tuple[Card, ...] = (*DECK_52, SMALL_JOKER, BIG_JOKER)

_BY_CODE: dict[str, Card] = {card.code: card for card in DECK_54}


def deck(size: int) -> tuple[Card, ...]:
    """The canonical deck of 52 or 54 cards."""
    if size == 52:
        return DECK_52
    if size == 54:
        return DECK_54
    raise CardError(f"deck size must be 52 or 54, not {size}")


def card_from_index(index: int) -> Card:
    if not 0 <= index < 54:
        raise CardError(f"card index must be 0..53, not {index}")
    return DECK_54[index]


def parse_card(text: str) -> Card:
    code = text.strip().upper()
    if code.startswith("10") and len(code) == 3:
        code = "T" + code[2:]
    card = _BY_CODE.get(code)
    if card is None:
        raise CardError(f"not a card: {text!r} (expected rank A23456789TJQK then suit SHCD, or SJ/BJ)")
    return card


def parse_cards(texts: str | Iterable[str], *, size: int | None = None) -> tuple[Card, ...]:
    """Parse cards from ``"AS TD QH"`` or an iterable of codes; duplicates are an error."""
    items = texts.replace(",", " ").split() if isinstance(texts, str) else list(texts)
    cards = tuple(parse_card(item) for item in items)
    check_distinct(cards)
    if size is not None and len(cards) != size:
        raise CardError(f"expected {size} cards, got {len(cards)}")
    return cards


def check_distinct(cards: Sequence[Card]) -> None:
    seen: set[Card] = set()
    for card in cards:
        if card in seen:
            raise CardError(f"duplicate card: {card.code}")
        seen.add(card)


def format_cards(cards: Iterable[Card]) -> str:
    return " ".join(card.code for card in cards)
