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

from bull.cards import Card
from bull.money import HOUSE, Settlement
from bull.rules import bai_buu, golden_bull
from bull.rules._config import ConfigError

WHOLE_HAND = ""
"""The group of a reveal that shows the whole hand at once."""


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
    # Cards the deal uses from the front of the deck order.
    cards_dealt: int
    areas: tuple[str, ...]
    # Seats in reveal order; the dealer/banker is revealed last.
    reveal_order: tuple[str, ...]
    # The parts of a hand revealed in turn, each for every seat in ``reveal_order``
    # before the next part: ``(WHOLE_HAND,)`` shows each hand at once.
    reveal_groups: tuple[str, ...]

    def reveal_part(self, hand: SeatHand, group: str, config: Any) -> SeatHand:
        """What one reveal step shows of ``hand``: the hand itself for ``WHOLE_HAND``."""

    def parse_config(self, settings: Mapping[str, str]) -> Any:
        """Validated, frozen configuration; raises ConfigError naming the key."""

    def config_settings(self, config: Any) -> dict[str, str]:
        """Every key of ``config`` as text (round-trips through ``parse_config``)."""

    def hold_minor(self, stake_minor: int, config: Any) -> int:
        """Worst-case liability of a bet of ``stake_minor``."""

    def hold_multiplier(self, config: Any) -> Fraction: ...

    def fixed_stake_minor(self, area: str, config: Any) -> int | None:
        """The one stake an area takes (a side bet at a fixed price), or None: the table's chips apply."""

    def deal(self, deck: Sequence[Card], config: Any) -> dict[str, SeatHand]:
        """Seat name -> evaluated hand, from the round's full deck order."""

    def claims_jackpot_pool(self, hands: Mapping[str, SeatHand], bets: Sequence[TableBet], config: Any) -> bool:
        """True when settling these bets pays from the progressive pool (it then needs the pool's balance)."""

    def settle(
        self, hands: Mapping[str, SeatHand], bets: Sequence[TableBet], config: Any, *, jackpot_pool_minor: int = 0
    ) -> Settlement: ...

    def area_outcomes(self, hands: Mapping[str, SeatHand], config: Any) -> dict[str, str]:
        """Each area's result against the dealer, as the same for every bettor ("win"/"loss"/"push")."""

    def area_odds(self, hands: Mapping[str, SeatHand], config: Any) -> dict[str, str]:
        """Each area's odds as a decimal, for variants with fixed odds ({} otherwise)."""


def reveal_steps(variant: Variant) -> tuple[tuple[str, str], ...]:
    """Every reveal of a round in order: (seat, group), group by group."""
    return tuple((seat, group) for group in variant.reveal_groups for seat in variant.reveal_order)


class NoSideBets:
    """What a variant without fixed-price side bets, a jackpot pool or fixed odds answers (most do)."""

    def fixed_stake_minor(self, area: str, config: Any) -> int | None:
        return None

    def claims_jackpot_pool(self, hands: Mapping[str, SeatHand], bets: Sequence[TableBet], config: Any) -> bool:
        return False

    def area_odds(self, hands: Mapping[str, SeatHand], config: Any) -> dict[str, str]:
        return {}


class GoldenBull(NoSideBets):
    variant_id = golden_bull.VARIANT_ID
    deck_size = 52
    cards_dealt = 5 * (len(golden_bull.AREAS) + 1)
    areas: tuple[str, ...] = golden_bull.AREAS
    reveal_order: tuple[str, ...] = (*golden_bull.AREAS, "dealer")
    reveal_groups: tuple[str, ...] = (WHOLE_HAND,)

    def reveal_part(self, hand: SeatHand, group: str, config: golden_bull.GoldenBullConfig) -> SeatHand:
        return hand

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
        self,
        hands: Mapping[str, SeatHand],
        bets: Sequence[TableBet],
        config: golden_bull.GoldenBullConfig,
        *,
        jackpot_pool_minor: int = 0,
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


class BaiBuu:
    """Banker against Player 01-03, four cards each; every hand's head is revealed, then every last.

    Main bets (``banker_0k``/``player_0k``) hold their stake; jackpot side bets
    (``jackpot_banker``, ``jackpot_player_0k``) cost exactly ``jackpot.stake_minor``
    and a four of a kind wins the progressive pool, whose balance the table reads
    from the wallet when it settles (``services/table/jackpot.py``).
    """

    variant_id = bai_buu.VARIANT_ID
    deck_size = 52
    cards_dealt = bai_buu.CARDS_DEALT
    areas: tuple[str, ...] = bai_buu.MAIN_AREAS + bai_buu.JACKPOT_AREAS
    reveal_order: tuple[str, ...] = (*bai_buu.PLAYER_SEATS, bai_buu.BANKER)
    reveal_groups: tuple[str, ...] = ("head", "last")

    def parse_config(self, settings: Mapping[str, str]) -> bai_buu.BaiBuuConfig:
        return bai_buu.load_config(settings)

    def config_settings(self, config: bai_buu.BaiBuuConfig) -> dict[str, str]:
        return bai_buu.config_settings(config)

    def hold_minor(self, stake_minor: int, config: bai_buu.BaiBuuConfig) -> int:
        return stake_minor  # no Bai Buu bet can lose more than its stake

    def hold_multiplier(self, config: bai_buu.BaiBuuConfig) -> Fraction:
        return Fraction(1)

    def fixed_stake_minor(self, area: str, config: bai_buu.BaiBuuConfig) -> int | None:
        return config.jackpot_stake_minor if area in bai_buu.JACKPOT_AREAS else None

    def deal(self, deck: Sequence[Card], config: bai_buu.BaiBuuConfig) -> dict[str, SeatHand]:
        dealt = bai_buu.deal(deck)
        return {seat: self._seat(seat, dealt.hand(seat), config) for seat in bai_buu.SEATS}

    @staticmethod
    def _seat(seat: str, hand: bai_buu.Hand, config: bai_buu.BaiBuuConfig) -> SeatHand:
        # A hand has no points or multiplier of its own: its groups have points, every main bet pays ``odds``.
        return SeatHand(seat, hand.cards, hand.category, 0, config.odds)

    def reveal_part(self, hand: SeatHand, group: str, config: bai_buu.BaiBuuConfig) -> SeatHand:
        assert group in self.reveal_groups, group
        made = bai_buu.make_hand(hand.cards)
        part = made.head if group == "head" else made.last
        return SeatHand(hand.seat, part.cards, part.category, part.points_x2 // 2, config.odds)

    @staticmethod
    def _deal(hands: Mapping[str, SeatHand]) -> bai_buu.Deal:
        return bai_buu.deal_hands([hands[seat].cards for seat in bai_buu.SEATS])

    def claims_jackpot_pool(
        self, hands: Mapping[str, SeatHand], bets: Sequence[TableBet], config: bai_buu.BaiBuuConfig
    ) -> bool:
        return any(
            b.area in bai_buu.JACKPOT_AREAS and hands[b.area.removeprefix("jackpot_")].category == "four_of_a_kind"
            for b in bets
        )

    def settle(
        self,
        hands: Mapping[str, SeatHand],
        bets: Sequence[TableBet],
        config: bai_buu.BaiBuuConfig,
        *,
        jackpot_pool_minor: int = 0,
    ) -> Settlement:
        made = [bai_buu.Bet(b.bet_id, b.player, b.area, b.stake_minor) for b in bets]
        return bai_buu.settle(
            self._deal(hands),
            [b for b in made if b.area in bai_buu.MAIN_AREAS],
            [b for b in made if b.area in bai_buu.JACKPOT_AREAS],
            jackpot_pool_minor,
            config,
        )

    def area_outcomes(self, hands: Mapping[str, SeatHand], config: bai_buu.BaiBuuConfig) -> dict[str, str]:
        dealt = self._deal(hands)
        outcomes = {}
        for area in bai_buu.MAIN_AREAS:
            d = bai_buu.main_bet_duel(dealt, area, config)
            outcomes[area] = {1: "half_win" if d.half_prize else "win", 0: "push", -1: "loss"}[d.result]
        for area in bai_buu.JACKPOT_AREAS:
            outcomes[area] = "win" if dealt.hand(area.removeprefix("jackpot_")).jackpot else "loss"
        return outcomes

    def area_odds(self, hands: Mapping[str, SeatHand], config: bai_buu.BaiBuuConfig) -> dict[str, str]:
        dealt = self._deal(hands)
        pay = {"three_of_a_kind": config.jackpot_pay_three_of_a_kind, "flush": config.jackpot_pay_flush}
        odds = {area: decimal_text(config.odds) for area in bai_buu.MAIN_AREAS}
        for area in bai_buu.JACKPOT_AREAS:
            won = pay.get(dealt.hand(area.removeprefix("jackpot_")).jackpot or "")
            odds[area] = decimal_text(won) if won is not None else ""  # a loss, or a share of the pool
        return odds


def decimal_text(value: Fraction) -> str:
    """``2`` -> "2", ``5/2`` -> "2.5" (exact for every odds a config can hold, up to 6 significant digits)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6g}"


VARIANTS: dict[str, Variant] = {v.variant_id: v for v in (GoldenBull(), BaiBuu())}

__all__ = [
    "VARIANTS",
    "WHOLE_HAND",
    "ConfigError",
    "NoSideBets",
    "SeatHand",
    "TableBet",
    "Variant",
    "decimal_text",
    "reveal_steps",
]
