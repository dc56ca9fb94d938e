"""What the table needs from a variant's rules, behind one small interface.

The table orchestrates any variant the same way: parse the configuration, hold a
bet's worst case, deal seats from the rng's deck order, reveal seats in order,
settle. Each variant adapts its pure rules module to this interface.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

from services.table.rules import golden_bull
from services.table.rules._config import ConfigError
from services.table.rules.cards import Card
from services.table.rules.money import HOUSE, Settlement


@dataclass(frozen=True, slots=True)
class SeatHand:
    seat: str
    cards: tuple[Card, ...]
    category: str
    points: int
    multiplier: Fraction


@dataclass(frozen=True, slots=True)
class TableBet:
    bet_id: str
    player: str
    area: str
    stake_minor: int


class Variant(Protocol):
    variant_id: str
    deck_size: int
    areas: tuple[str, ...]
    # Seats in reveal order; the dealer/banker is revealed last.
    reveal_order: tuple[str, ...]

    def parse_config(self, settings: Mapping[str, str]) -> Any:
        """Validated, frozen configuration; raises ConfigError naming the key."""

    def config_settings(self, config: Any) -> dict[str, str]:
        """Every key of ``config`` as text (round-trips through ``parse_config``)."""

    def hold_minor(self, stake_minor: int, config: Any) -> int:
        """Worst-case liability of a bet of ``stake_minor``."""

    def hold_multiplier(self, config: Any) -> Fraction: ...

    def deal(self, deck: Sequence[Card], config: Any) -> dict[str, SeatHand]:
        """Seat name -> evaluated hand, from the round's full deck order."""

    def settle(self, hands: Mapping[str, SeatHand], bets: Sequence[TableBet], config: Any) -> Settlement: ...

    def area_outcomes(self, hands: Mapping[str, SeatHand], config: Any) -> dict[str, str]:
        """Each area's result against the dealer, as the same for every bettor ("win"/"loss"/"push")."""


class GoldenBull:
    variant_id = golden_bull.VARIANT_ID
    deck_size = 52
    areas: tuple[str, ...] = golden_bull.AREAS
    reveal_order: tuple[str, ...] = (*golden_bull.AREAS, "dealer")

    def parse_config(self, settings: Mapping[str, str]) -> golden_bull.GoldenBullConfig:
        return golden_bull.GoldenBullConfig.from_settings(dict(settings))

    def config_settings(self, config: golden_bull.GoldenBullConfig) -> dict[str, str]:
        return config.to_settings()

    def hold_minor(self, stake_minor: int, config: golden_bull.GoldenBullConfig) -> int:
        return golden_bull.hold_minor(stake_minor, config)

    def hold_multiplier(self, config: golden_bull.GoldenBullConfig) -> Fraction:
        return Fraction(1) if config.mode is golden_bull.Mode.STAKE_CAPPED else config.max_multiplier

    def deal(self, deck: Sequence[Card], config: golden_bull.GoldenBullConfig) -> dict[str, SeatHand]:
        dealt = golden_bull.deal(deck)
        seats = {"dealer": dealt.dealer} | dict(zip(golden_bull.AREAS, dealt.areas, strict=True))
        hands = {}
        for seat, cards in seats.items():
            hand = golden_bull.evaluate(cards, config)
            hands[seat] = SeatHand(seat, cards, str(hand.category), hand.points, config.multiplier(hand.category))
        return hands

    def settle(
        self, hands: Mapping[str, SeatHand], bets: Sequence[TableBet], config: golden_bull.GoldenBullConfig
    ) -> Settlement:
        return golden_bull.settle(
            hands["dealer"].cards,
            [hands[area].cards for area in golden_bull.AREAS],
            [golden_bull.Bet(b.bet_id, b.player, b.area, b.stake_minor) for b in bets],
            config,
            dealer_party=HOUSE,
        )

    def area_outcomes(self, hands: Mapping[str, SeatHand], config: golden_bull.GoldenBullConfig) -> dict[str, str]:
        dealer = golden_bull.evaluate(hands["dealer"].cards, config)
        return {
            area: str(golden_bull.outcome(golden_bull.evaluate(hands[area].cards, config), dealer, config))
            for area in golden_bull.AREAS
        }


VARIANTS: dict[str, Variant] = {v.variant_id: v for v in (GoldenBull(),)}

__all__ = ["VARIANTS", "ConfigError", "SeatHand", "TableBet", "Variant"]
