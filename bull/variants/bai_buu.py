"""Bai Buu (``bai_buu``): the house banks against Player 01-03, four cards each; heads revealed, then lasts.

Main bets (``banker_0k``/``player_0k``) hold their stake; jackpot side bets
(``jackpot_banker``, ``jackpot_player_0k``) cost exactly ``jackpot.stake_minor``
and a four of a kind wins the progressive pool, whose payable balance the table
passes in ``Funding.jackpot_pool_minor``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from bull.money import Outcome, Settlement
from bull.rules import bai_buu as bu
from bull.variants.base import (
    CardGame,
    DealInput,
    Funding,
    RoundShape,
    SeatHand,
    TableBet,
    Variant,
    decimal_text,
    deck_of,
    fund_bets,
)

HEAD = "head"
LAST = "last"


class BaiBuu(CardGame[bu.BaiBuuConfig]):
    variant_id = bu.VARIANT_ID
    shape = RoundShape.HOUSE_DEALER
    deck_size = 52
    cards_dealt = bu.CARDS_DEALT
    areas: tuple[str, ...] = bu.MAIN_AREAS + bu.JACKPOT_AREAS
    reveal_order: tuple[str, ...] = (*bu.PLAYER_SEATS, bu.BANKER)
    reveal_groups: tuple[str, ...] = (HEAD, LAST)

    def parse_config(self, settings: Mapping[str, str]) -> bu.BaiBuuConfig:
        return bu.load_config(settings)

    def config_settings(self, config: bu.BaiBuuConfig) -> dict[str, str]:
        return bu.config_settings(config)

    def hold_minor(self, stake_minor: int, config: bu.BaiBuuConfig) -> int:
        return stake_minor  # no Bai Buu bet can lose more than its stake

    def hold_multiplier(self, config: bu.BaiBuuConfig) -> Fraction:
        return Fraction(1)

    def fixed_stake_minor(self, area: str, config: bu.BaiBuuConfig) -> int | None:
        return config.jackpot_stake_minor if area in bu.JACKPOT_AREAS else None

    def deal(self, drawn: DealInput, config: bu.BaiBuuConfig) -> dict[str, SeatHand]:
        dealt = bu.deal(deck_of(drawn))
        # A hand has no points or multiplier of its own: its groups have points, every main bet pays ``odds``.
        return {
            seat: SeatHand(seat, dealt.hand(seat).cards, dealt.hand(seat).category, 0, config.odds) for seat in bu.SEATS
        }

    def reveal_part(self, hand: SeatHand, group: str, config: bu.BaiBuuConfig) -> SeatHand:
        assert group in self.reveal_groups, group
        made = bu.make_hand(hand.cards)
        part = made.head if group == HEAD else made.last
        return SeatHand(hand.seat, part.cards, part.category, part.points_x2 // 2, config.odds)

    @staticmethod
    def _deal(hands: Mapping[str, SeatHand]) -> bu.Deal:
        return bu.deal_hands([hands[seat].cards for seat in bu.SEATS])

    def claims_jackpot_pool(
        self, hands: Mapping[str, SeatHand], bets: Sequence[TableBet], config: bu.BaiBuuConfig
    ) -> bool:
        return any(
            b.area in bu.JACKPOT_AREAS and hands[b.area.removeprefix("jackpot_")].category == "four_of_a_kind"
            for b in bets
        )

    def settle(
        self, hands: Mapping[str, SeatHand], bets: Sequence[TableBet], config: bu.BaiBuuConfig, funding: Funding
    ) -> Settlement:
        made = [bu.Bet(b.bet_id, b.player, b.area, b.stake_minor) for b in bets]
        settlement = bu.settle(
            self._deal(hands),
            [b for b in made if b.area in bu.MAIN_AREAS],
            [b for b in made if b.area in bu.JACKPOT_AREAS],
            funding.jackpot_pool_minor,
            config,
        )
        return fund_bets(settlement, bets)

    def area_outcomes(
        self, hands: Mapping[str, SeatHand], config: bu.BaiBuuConfig, settlement: Settlement | None = None
    ) -> dict[str, str]:
        """By what a bet on each area nets; a four of a kind's jackpot bets net what the pool paid them,
        so that area reads its bets' outcome from ``settlement`` (a win when nobody bet on it)."""
        dealt = self._deal(hands)
        outcomes = {area: str(bu.main_outcome(bu.main_bet_duel(dealt, area, config), config)) for area in bu.MAIN_AREAS}
        settled = {r.area: r.outcome for r in settlement.bets} if settlement is not None else {}
        for area in bu.JACKPOT_AREAS:
            known = bu.jackpot_outcome(dealt.hand(area.removeprefix("jackpot_")), config)
            outcomes[area] = str(known or settled.get(area, Outcome.WIN))
        return outcomes

    def area_odds(self, hands: Mapping[str, SeatHand], config: bu.BaiBuuConfig) -> dict[str, str]:
        dealt = self._deal(hands)
        pay = {"three_of_a_kind": config.jackpot_pay_three_of_a_kind, "flush": config.jackpot_pay_flush}
        odds = {area: decimal_text(config.odds) for area in bu.MAIN_AREAS}
        for area in bu.JACKPOT_AREAS:
            won = pay.get(dealt.hand(area.removeprefix("jackpot_")).jackpot or "")
            odds[area] = decimal_text(won) if won is not None else ""  # a loss, or a share of the pool
        return odds


BAI_BUU: Variant[bu.BaiBuuConfig] = BaiBuu()
