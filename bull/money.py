"""Settlement values shared by every variant.

A settlement is a list of transfers between parties. Each transfer moves a
positive integer amount of minor units from a payer to a payee, so the whole
settlement balances by construction; ``Settlement.check`` additionally checks
that every bet's stated net equals its transfers and never exceeds what was
held for it. Parties are opaque strings: the caller's player and dealer ids, and
the system accounts below.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

# The system accounts, from the chart of accounts (bull.accounts), under the names the
# rules and the table have always imported them by.
from bull.accounts import COMMISSION_REVENUE as COMMISSION_REVENUE
from bull.accounts import FEES as FEES
from bull.accounts import HOUSE as HOUSE
from bull.accounts import JACKPOT_POOL as JACKPOT_POOL
from bull.accounts import REBATE_EXPENSE as REBATE_EXPENSE
from bull.accounts import SYSTEM_ACCOUNTS as SYSTEM_ACCOUNTS

BPS_DENOMINATOR = 10_000


class SettlementError(AssertionError):
    """A settlement that does not balance or breaks its holds: a programming error."""


class Outcome(StrEnum):
    WIN = "win"
    LOSS = "loss"
    PUSH = "push"
    HALF_WIN = "half_win"  # Bai Buu: the winning side won a group with 6 points
    DRINK_WATER = "drink_water"  # 喝水: the dealer pool ran out, stake back
    IMMUNE = "immune"  # 免死: a player's 0.01 grab turns a loss into a tie
    REFUND = "refund"  # round voided or bet refunded before the opening


class TransferKind(StrEnum):
    WIN = "win"  # dealer/house pays a winning bettor
    LOSS = "loss"  # losing bettor pays dealer/house
    COMMISSION = "commission"
    REBATE = "rebate"
    JACKPOT_CONTRIBUTION = "jackpot_contribution"
    JACKPOT_PAYOUT = "jackpot_payout"
    JACKPOT_STAKE = "jackpot_stake"
    JACKPOT_SEED = "jackpot_seed"  # Bai Buu: the house funds the pool's seed / reset amount
    FEE = "fee"
    # Red-envelope bull: the dealer's three per-round fees, one transfer each to FEES.
    DEALER_FEE = "dealer_fee"
    SERVICE_FEE = "service_fee"
    ENVELOPE_FEE = "envelope_fee"


@dataclass(frozen=True, slots=True)
class Transfer:
    payer: str
    payee: str
    amount_minor: int
    kind: TransferKind
    bet_id: str | None = None
    # The wallet hold the payer pays from ("" = their available balance). The rules leave it
    # empty; a variant's settle (``bull.variants``) names it, so a settlement says who funds what.
    hold_id: str = ""

    def __post_init__(self) -> None:
        if type(self.amount_minor) is not int or self.amount_minor <= 0:
            raise SettlementError(f"transfer amount must be a positive int: {self.amount_minor!r}")
        if self.payer == self.payee:
            raise SettlementError(f"transfer to self: {self.payer}")


@dataclass(frozen=True, slots=True)
class BetResult:
    """The outcome of one bet. ``net_minor`` is the bettor's balance change from it."""

    bet_id: str
    player: str
    area: str
    stake_minor: int
    hold_minor: int
    outcome: Outcome
    net_minor: int


@dataclass(frozen=True, slots=True)
class Settlement:
    bets: tuple[BetResult, ...]
    transfers: tuple[Transfer, ...]
    # Fractions of a minor unit that rounding toward the house left behind, per
    # bet id, as (numerator, denominator) of one minor unit: recorded, never dropped.
    remainders: tuple[tuple[str, int, int], ...] = field(default=())

    def net_by_party(self) -> dict[str, int]:
        net: dict[str, int] = defaultdict(int)
        for t in self.transfers:
            net[t.payer] -= t.amount_minor
            net[t.payee] += t.amount_minor
        return dict(net)

    def check(self) -> Settlement:
        """Raise SettlementError unless every bet's net equals its transfers and fits its hold."""
        players = {bet.bet_id: bet.player for bet in self.bets}
        by_bet: dict[str, int] = defaultdict(int)
        for t in self.transfers:
            player = players.get(t.bet_id) if t.bet_id is not None else None
            if player is None:
                continue
            if t.payee == player:
                by_bet[t.bet_id] += t.amount_minor  # type: ignore[index]
            if t.payer == player:
                by_bet[t.bet_id] -= t.amount_minor  # type: ignore[index]
        for bet in self.bets:
            if by_bet.get(bet.bet_id, 0) != bet.net_minor:
                raise SettlementError(f"bet {bet.bet_id}: net {bet.net_minor} != transfers {by_bet.get(bet.bet_id, 0)}")
            if -bet.net_minor > bet.hold_minor:
                raise SettlementError(f"bet {bet.bet_id}: loss {-bet.net_minor} exceeds hold {bet.hold_minor}")
        if sum(self.net_by_party().values()) != 0:
            raise SettlementError("settlement does not balance")
        return self


def outcome_of(net: Fraction | int) -> Outcome:
    """A bet's outcome by what its bettor nets: a gain is a win, a loss a loss, nothing a push.

    Every variant records a bet's outcome and announces an area's outcome through this, from
    the same exact (unrounded) net, so the public result can never contradict the money.
    """
    return Outcome.WIN if net > 0 else Outcome.LOSS if net < 0 else Outcome.PUSH


def floor_div_toward_house(numerator: int, denominator: int) -> tuple[int, int]:
    """Amount owed *to a player*, rounded down; returns (amount, remainder numerator)."""
    if denominator <= 0:
        raise SettlementError("denominator must be positive")
    return numerator // denominator, numerator % denominator
