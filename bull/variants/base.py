"""What every game is to the table, the CLI and the auditor: one ``Variant`` object.

A variant turns text settings into a frozen configuration, says what a bet holds,
deals the round from what the rng drew (a deck order, or a red envelope's split),
says in which steps the hands are revealed, and settles the round's bets into
transfers that name their real payer, payee and the hold each payment comes from.
The table runs exactly this ``settle`` and the ledger's recompute runs it again on
the round's public record, so the two are compared transfer by transfer.

Pure: no I/O, clock or randomness; the drawn deck or split arrives as an argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from fractions import Fraction
from typing import Generic, Protocol, TypeVar

from bull.cards import Card
from bull.money import Settlement, Transfer

WHOLE_HAND = ""
"""The group of a reveal that shows the whole hand at once."""


class RoundShape(StrEnum):
    """Who sits across the table from the bettors; each shape is one round state machine at the table."""

    HOUSE_DEALER = "house_dealer"  # the house deals and banks (golden_bull, bai_buu)
    BANKER_SEAT = "banker_seat"  # a queued player banks a tenure of rounds (baibian_bull)
    BIDDING_DEALER = "bidding_dealer"  # players bid for the dealer seat every round (red_envelope_bull)


@dataclass(frozen=True, slots=True)
class SeatHand:
    """One seat's hand as dealt (or one part of it, as revealed).

    A red-envelope hand is an amount of money, not cards: ``cards`` is empty and
    ``amount_minor`` is what the seat grabbed.
    """

    seat: str
    cards: tuple[Card, ...]
    category: str
    points: int
    multiplier: Fraction
    amount_minor: int = 0


@dataclass(frozen=True, slots=True)
class TableBet:
    """A bet as the round settles it; ``hold_id`` is the wallet hold that covers it."""

    bet_id: str
    player: str
    area: str
    stake_minor: int
    hold_id: str = ""


@dataclass(frozen=True, slots=True)
class Funding:
    """The round's money beyond its bets: who deals or banks it, and from which hold.

    ``dealer`` is the account of the player dealing or banking ("" when the house
    does); ``dealer_hold_id``/``dealer_hold_minor`` the hold their payments come
    from; ``dealer_pool_minor`` the red-envelope dealer's winning bid;
    ``jackpot_pool_minor`` what the progressive pool can pay this round.
    """

    dealer: str = ""
    dealer_hold_id: str = ""
    dealer_hold_minor: int = 0
    dealer_pool_minor: int = 0
    jackpot_pool_minor: int = 0


@dataclass(frozen=True, slots=True)
class EnvelopeSplit:
    """A red envelope as the rng split it: the deal input of ``red_envelope_bull``.

    ``seats[p]`` is the seat at participant position ``p`` (the dealer first, then
    each bet's id in bet order); ``amounts[k]`` is the k-th share drawn and
    ``grab_order[k]`` the position that grabs it.
    """

    seats: tuple[str, ...]
    amounts: tuple[int, ...]
    grab_order: tuple[int, ...]


DealInput = Sequence[Card] | EnvelopeSplit

C = TypeVar("C")
"""A variant's configuration: the frozen dataclass its ``parse_config`` returns and every other method takes."""


class Variant(Protocol[C]):
    """One game, typed by its configuration ``C``: what ``parse_config`` returns is what the rest take.

    Each variant module pins its singleton to its own configuration
    (``GOLDEN_BULL: Variant[GoldenBullConfig]``), so mypy checks every method of
    that variant against that dataclass. Code that finds a variant by id holds a
    ``Variant[Any]`` (see ``bull.variants.VARIANTS``).
    """

    variant_id: str
    shape: RoundShape
    # Cards the rng shuffles (0: the round is dealt from an envelope split instead).
    deck_size: int
    # Cards the deal uses from the front of the deck order.
    cards_dealt: int
    # What the rng's commitment is for: "deck" or "envelope".
    commit_purpose: str
    areas: tuple[str, ...]
    # The parts of a hand revealed in turn (``(WHOLE_HAND,)`` shows each hand at once).
    reveal_groups: tuple[str, ...]
    # The table's betting window when the table does not set one (None: the table's default).
    default_betting_seconds: int | None

    def parse_config(self, settings: Mapping[str, str]) -> C:
        """Validated, frozen configuration; raises ConfigError naming the key."""

    def config_settings(self, config: C) -> dict[str, str]:
        """Every key of ``config`` as text (round-trips through ``parse_config``)."""

    def hold_minor(self, stake_minor: int, config: C) -> int:
        """Worst-case liability of a bet of ``stake_minor``."""

    def hold_multiplier(self, config: C) -> Fraction: ...

    def fixed_stake_minor(self, area: str, config: C) -> int | None:
        """The one stake an area takes (a side bet at a fixed price), or None: the table's chips apply."""

    def deal(self, drawn: DealInput, config: C) -> dict[str, SeatHand]:
        """Seat -> evaluated hand, from the round's deck order or envelope split.

        Raises ValueError for an envelope split that is not one valid share per seat.
        """

    def reveal_plan(self, hands: Mapping[str, SeatHand]) -> tuple[tuple[str, str], ...]:
        """Every reveal of the round in order: (seat, group)."""

    def reveal_part(self, hand: SeatHand, group: str, config: C) -> SeatHand:
        """What one reveal step shows of ``hand``: the hand itself for ``WHOLE_HAND``."""

    def void_reason(self, hands: Mapping[str, SeatHand], config: C) -> str:
        """Why these hands void the round instead of settling it ("" when they settle)."""

    def claims_jackpot_pool(self, hands: Mapping[str, SeatHand], bets: Sequence[TableBet], config: C) -> bool:
        """True when settling these bets pays from the progressive pool (it then needs the pool's balance)."""

    def settle(
        self, hands: Mapping[str, SeatHand], bets: Sequence[TableBet], config: C, funding: Funding
    ) -> Settlement:
        """Every bet's result and every transfer, each naming its real payer, payee and funding hold."""

    def area_outcomes(
        self, hands: Mapping[str, SeatHand], config: C, settlement: Settlement | None = None
    ) -> dict[str, str]:
        """Each area's outcome, the same for every bet on it: what ``settle`` records for such a bet
        under ``config`` (``bull.money.outcome_of`` of what it nets), so the public result and the
        money cannot disagree. ``settlement`` is the round's own, for an area whose bets net what
        the round's other bets leave them (a Bai Buu four of a kind shares the jackpot pool)."""

    def area_odds(self, hands: Mapping[str, SeatHand], config: C) -> dict[str, str]:
        """Each area's odds as a decimal, for variants with fixed odds ({} otherwise)."""


def card_reveal_plan(reveal_order: Sequence[str], groups: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Group by group, each seat in ``reveal_order`` (the dealer or banker last)."""
    return tuple((seat, group) for group in groups for seat in reveal_order)


class CardGame(Generic[C]):
    """What the card variants share: a deck, reveals in a fixed seat order, no void after the deal.

    Generic over the variant's configuration ``C`` so that, mixed into a variant, its methods
    take that variant's configuration as the protocol does.
    """

    commit_purpose = "deck"
    default_betting_seconds: int | None = None
    reveal_order: tuple[str, ...] = ()
    reveal_groups: tuple[str, ...] = (WHOLE_HAND,)

    @property
    def deal_order(self) -> tuple[str, ...]:
        """The seats in the order their cards left the deck: the dealer or banker (last to be
        revealed) first, then the others in reveal order."""
        return self.reveal_order[-1:] + self.reveal_order[:-1]

    def reveal_plan(self, hands: Mapping[str, SeatHand]) -> tuple[tuple[str, str], ...]:
        return card_reveal_plan(self.reveal_order, self.reveal_groups)

    def void_reason(self, hands: Mapping[str, SeatHand], config: C) -> str:
        return ""


class NoSideBets(Generic[C]):
    """What a variant without fixed-price side bets, a jackpot pool or fixed odds answers (most do);
    generic over the variant's configuration ``C`` like ``CardGame``."""

    def fixed_stake_minor(self, area: str, config: C) -> int | None:
        return None

    def claims_jackpot_pool(self, hands: Mapping[str, SeatHand], bets: Sequence[TableBet], config: C) -> bool:
        return False

    def area_odds(self, hands: Mapping[str, SeatHand], config: C) -> dict[str, str]:
        return {}


def deck_of(drawn: DealInput) -> Sequence[Card]:
    if isinstance(drawn, EnvelopeSplit):
        raise TypeError("a card variant is dealt from a deck order, not an envelope split")
    return drawn


def fund_bets(settlement: Settlement, bets: Sequence[TableBet]) -> Settlement:
    """Each bettor pays from their bet's hold; the house and system accounts from their balance."""
    holds = {b.bet_id: (b.player, b.hold_id) for b in bets}

    def funded(t: Transfer) -> Transfer:
        player, hold = holds.get(t.bet_id or "", ("", ""))
        return replace(t, hold_id=hold) if hold and t.payer == player else t

    return replace(settlement, transfers=tuple(funded(t) for t in settlement.transfers))


def pay_from_hold(transfers: Sequence[Transfer], payer: str, hold_id: str, hold_minor: int) -> tuple[Transfer, ...]:
    """``payer`` pays from ``hold_id`` until ``hold_minor`` is spent, then from their balance.

    A payment that straddles the end of the hold is split in two transfers of the
    same kind and bet: the first from the hold, the rest without one (the wallet
    pays it from what earlier transfers of the settlement credited the payer and
    refuses more).
    """
    left = hold_minor
    out: list[Transfer] = []
    for t in transfers:
        if t.payer != payer:
            out.append(t)
            continue
        from_hold = min(left, t.amount_minor)
        left -= from_hold
        for amount, hold in ((from_hold, hold_id), (t.amount_minor - from_hold, "")):
            if amount:
                out.append(replace(t, amount_minor=amount, hold_id=hold))
    return tuple(out)


def decimal_text(value: Fraction) -> str:
    """``2`` -> "2", ``5/2`` -> "2.5" (exact for every odds a config can hold, up to 6 significant digits)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6g}"
