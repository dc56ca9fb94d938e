"""Golden Bull (``golden_bull``): the house deals against three areas, five cards each, whole hands revealed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from bull.money import HOUSE, Settlement
from bull.rules import golden_bull as gb
from bull.variants.base import (
    CardGame,
    DealInput,
    Funding,
    NoSideBets,
    RoundShape,
    SeatHand,
    TableBet,
    Variant,
    deck_of,
    fund_bets,
)

DEALER_SEAT = "dealer"


class GoldenBull(CardGame[gb.GoldenBullConfig], NoSideBets[gb.GoldenBullConfig]):
    variant_id = gb.VARIANT_ID
    shape = RoundShape.HOUSE_DEALER
    deck_size = 52
    cards_dealt = gb.HAND_SIZE * (len(gb.AREAS) + 1)
    areas: tuple[str, ...] = gb.AREAS
    reveal_order: tuple[str, ...] = (*gb.AREAS, DEALER_SEAT)

    def parse_config(self, settings: Mapping[str, str]) -> gb.GoldenBullConfig:
        return gb.GoldenBullConfig.from_settings(dict(settings))

    def config_settings(self, config: gb.GoldenBullConfig) -> dict[str, str]:
        return config.to_settings()

    def hold_minor(self, stake_minor: int, config: gb.GoldenBullConfig) -> int:
        return gb.hold_minor(stake_minor, config)

    def hold_multiplier(self, config: gb.GoldenBullConfig) -> Fraction:
        return Fraction(1) if config.mode is gb.Mode.STAKE_CAPPED else config.max_multiplier

    def deal(self, drawn: DealInput, config: gb.GoldenBullConfig) -> dict[str, SeatHand]:
        dealt = gb.deal(deck_of(drawn))
        seats = {DEALER_SEAT: dealt.dealer} | dict(zip(gb.AREAS, dealt.areas, strict=True))
        hands = {}
        for seat, cards in seats.items():
            hand = gb.evaluate(cards, config)
            hands[seat] = SeatHand(seat, cards, str(hand.category), hand.points, config.multiplier(hand.category))
        return hands

    def reveal_part(self, hand: SeatHand, group: str, config: gb.GoldenBullConfig) -> SeatHand:
        return hand

    def settle(
        self,
        hands: Mapping[str, SeatHand],
        bets: Sequence[TableBet],
        config: gb.GoldenBullConfig,
        funding: Funding,
    ) -> Settlement:
        settlement = gb.settle(
            hands[DEALER_SEAT].cards,
            [hands[area].cards for area in gb.AREAS],
            [gb.Bet(b.bet_id, b.player, b.area, b.stake_minor) for b in bets],
            config,
            dealer_party=HOUSE,
        )
        return fund_bets(settlement, bets)

    def area_outcomes(
        self, hands: Mapping[str, SeatHand], config: gb.GoldenBullConfig, settlement: Settlement | None = None
    ) -> dict[str, str]:
        cards = [hands[area].cards for area in gb.AREAS]
        return {area: str(o) for area, o in gb.area_outcomes(hands[DEALER_SEAT].cards, cards, config).items()}


GOLDEN_BULL: Variant[gb.GoldenBullConfig] = GoldenBull()
