"""68 NiuNiu, red-envelope bull (``red_envelope_bull``): the envelope is the deal.

The round's dealer won the seat by bidding; the bid is the dealer pool, held with
the dealer's three fees (``bid_hold_minor``). Bets are against the dealer (one
area, ``dealer``), each held at stake x the highest multiplier. The deal input is
the rng's ``EnvelopeSplit``: position 0 is the dealer (seat ``dealer``), then one
position per bet in bet order (seat = the bet's id); each seat's hand is the
amount it grabbed, and the hands are revealed one grab at a time, in grab order.

``settle`` runs the rules' ``settle`` and funds it: every bettor pays from their
bet's hold; the dealer pays from the pool's hold until it is spent and past it
from what the round's losers paid them (``pay_from_hold``), so the dealer never
loses more than the pool plus the fees. The dealer grabbing 0.01 voids the round
(``void_reason``) and the table re-deals.

Table settings besides the rules' keys: ``bidding.min_minor`` and
``bidding.increment_minor`` (10 000 each: the seed's "at least 100 above the
highest bid" read as 100.00) and ``bidding.seconds`` (18).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from bull import fairness as fair
from bull.money import Settlement
from bull.rules import config as cfg
from bull.rules import red_envelope as re_
from bull.variants.base import (
    WHOLE_HAND,
    DealInput,
    EnvelopeSplit,
    Funding,
    NoSideBets,
    RoundShape,
    SeatHand,
    TableBet,
    Variant,
    fund_bets,
    pay_from_hold,
)

AREA = re_.AREA
DEALER_SEAT = "dealer"
MIN_SHARE_MINOR = 1  # every share at least 0.01
DEFAULT_BETTING_SECONDS = 40
DEALER_VOID = "DEALER_GRABBED_0.01"

BID_MIN = "bidding.min_minor"
BID_INCREMENT = "bidding.increment_minor"
BIDDING_SECONDS = "bidding.seconds"
TABLE_KEYS = (BID_MIN, BID_INCREMENT, BIDDING_SECONDS)
DEFAULT_BID_MIN_MINOR = 10_000
DEFAULT_BID_INCREMENT_MINOR = 10_000
DEFAULT_BIDDING_SECONDS = 18
MAX_BID_MINOR = 10**13


@dataclass(frozen=True, slots=True)
class EnvelopeTableConfig:
    rules: re_.RedEnvelopeConfig = field(default_factory=re_.RedEnvelopeConfig)
    bid_min_minor: int = DEFAULT_BID_MIN_MINOR
    bid_increment_minor: int = DEFAULT_BID_INCREMENT_MINOR
    bidding_seconds: int = DEFAULT_BIDDING_SECONDS

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> EnvelopeTableConfig:
        flat = dict(settings)
        minimum = cfg.as_int(BID_MIN, flat.pop(BID_MIN, DEFAULT_BID_MIN_MINOR), low=1, high=MAX_BID_MINOR)
        increment = cfg.as_int(
            BID_INCREMENT, flat.pop(BID_INCREMENT, DEFAULT_BID_INCREMENT_MINOR), low=1, high=MAX_BID_MINOR
        )
        seconds = cfg.as_int(BIDDING_SECONDS, flat.pop(BIDDING_SECONDS, DEFAULT_BIDDING_SECONDS), low=1, high=600)
        return cls(re_.load_config(flat), minimum, increment, seconds)

    def to_settings(self) -> dict[str, str]:
        return re_.config_settings(self.rules) | {
            BID_MIN: str(self.bid_min_minor),
            BID_INCREMENT: str(self.bid_increment_minor),
            BIDDING_SECONDS: str(self.bidding_seconds),
        }

    def bid_hold_minor(self, amount_minor: int) -> int:
        """A bid's hold: the pool it would be plus the dealer's three fees."""
        return re_.dealer_hold_minor(amount_minor, self.rules)

    def next_bid_minor(self, highest_minor: int) -> int:
        if not highest_minor:
            return self.bid_min_minor
        return max(self.bid_min_minor, highest_minor + self.bid_increment_minor)


def check_split(split: EnvelopeSplit) -> None:
    """Raise ValueError unless the split is one valid share per seat (else: an envelope error, re-dealt)."""
    participants = len(split.seats)
    if len(split.amounts) != participants or len(split.grab_order) != participants:
        raise ValueError(f"{len(split.amounts)} shares for {participants} participants")
    if sorted(split.grab_order) != list(range(participants)):
        raise ValueError(f"grab order {list(split.grab_order)} is not a permutation of the participants")
    if min(split.amounts) < MIN_SHARE_MINOR or max(split.amounts) > re_.MAX_AMOUNT_MINOR:
        raise ValueError(f"a share outside 1..{re_.MAX_AMOUNT_MINOR}: {list(split.amounts)}")
    if split.seats[0] != DEALER_SEAT or len(set(split.seats)) != participants:
        raise ValueError(f"seats must be the dealer, then distinct bets: {list(split.seats)}")


def envelope_record(total_minor: int, amounts: Sequence[int], grab_order: Sequence[int]) -> fair.EnvelopeRecord | None:
    """A round's revealed grabs as the verifier takes them (in grab order), None with no grab."""
    if not amounts:
        return None
    return fair.EnvelopeRecord(
        total_minor, len(amounts), MIN_SHARE_MINOR, amounts=tuple(amounts), grab_order=tuple(grab_order)
    )


class RedEnvelopeBull(NoSideBets[EnvelopeTableConfig]):
    variant_id = re_.VARIANT_ID
    shape = RoundShape.BIDDING_DEALER
    deck_size = 0
    cards_dealt = 0
    commit_purpose = "envelope"
    areas: tuple[str, ...] = (AREA,)
    reveal_groups: tuple[str, ...] = (WHOLE_HAND,)
    default_betting_seconds: int | None = DEFAULT_BETTING_SECONDS

    def parse_config(self, settings: Mapping[str, str]) -> EnvelopeTableConfig:
        return EnvelopeTableConfig.from_settings(settings)

    def config_settings(self, config: EnvelopeTableConfig) -> dict[str, str]:
        return config.to_settings()

    def hold_minor(self, stake_minor: int, config: EnvelopeTableConfig) -> int:
        return re_.hold_minor(stake_minor, config.rules)

    def hold_multiplier(self, config: EnvelopeTableConfig) -> Fraction:
        return Fraction(config.rules.max_multiplier)

    def deal(self, drawn: DealInput, config: EnvelopeTableConfig) -> dict[str, SeatHand]:
        """Seat -> the amount it grabbed as a hand, in grab order (the reveal plan's order)."""
        if not isinstance(drawn, EnvelopeSplit):
            raise TypeError("a red-envelope round is dealt from an envelope split, not a deck")
        check_split(drawn)
        hands = {}
        for amount, position in zip(drawn.amounts, drawn.grab_order, strict=True):
            seat = drawn.seats[position]
            hand = re_.evaluate(amount)
            multiplier = Fraction(config.rules.multiplier(hand.category))
            hands[seat] = SeatHand(seat, (), hand.category, hand.points, multiplier, amount)
        return hands

    def reveal_plan(self, hands: Mapping[str, SeatHand]) -> tuple[tuple[str, str], ...]:
        return tuple((seat, WHOLE_HAND) for seat in hands)

    def reveal_part(self, hand: SeatHand, group: str, config: EnvelopeTableConfig) -> SeatHand:
        return hand

    def void_reason(self, hands: Mapping[str, SeatHand], config: EnvelopeTableConfig) -> str:
        if hands[DEALER_SEAT].amount_minor == re_.VOID_AMOUNT_MINOR:
            return f"{DEALER_VOID}: the round is re-dealt"
        return ""

    def settle(
        self,
        hands: Mapping[str, SeatHand],
        bets: Sequence[TableBet],
        config: EnvelopeTableConfig,
        funding: Funding,
    ) -> Settlement:
        rnd = re_.EnvelopeRound(
            dealer=funding.dealer,
            dealer_pool_minor=funding.dealer_pool_minor,
            dealer_amount_minor=hands[DEALER_SEAT].amount_minor,
            bets=tuple(re_.EnvelopeBet(b.bet_id, b.player, b.stake_minor, hands[b.bet_id].amount_minor) for b in bets),
        )
        settlement = fund_bets(re_.settle(rnd, config.rules), bets)
        transfers = pay_from_hold(
            settlement.transfers, funding.dealer, funding.dealer_hold_id, funding.dealer_hold_minor
        )
        return Settlement(settlement.bets, transfers, settlement.remainders)

    def area_outcomes(
        self, hands: Mapping[str, SeatHand], config: EnvelopeTableConfig, settlement: Settlement | None = None
    ) -> dict[str, str]:
        """None: the one area's bets each hold their own grab, so no outcome is the same for all of them."""
        return {}


RED_ENVELOPE_BULL: Variant[EnvelopeTableConfig] = RedEnvelopeBull()
