"""68 NiuNiu, red-envelope bull (variant id ``red_envelope_bull``): docs/rules/red_envelope_bull.md.

A hand is the amount a participant grabbed from the round's red envelope, in
minor units (cents). Its digits are those of the amount written with two
decimals: ``3.42`` -> 3, 4, 2; ``0.50`` -> 0, 5, 0; ``12.34`` -> 1, 2, 3, 4. The
seed's "three digits" are the amounts below 10.00; larger amounts use all their
digits (interpretation).

Settlement of one round (everything in integer minor units):

1. The dealer grabbing 0.01 voids the round: every bet ``REFUND``, no transfer,
   no fee (the round is re-dealt).
2. Each bet is compared with the dealer's hand. A losing player pays
   ``stake x dealer multiplier``; a player holding 0.01 is immune (免死): the loss
   becomes a tie (``IMMUNE``). A tie is a ``PUSH``.
3. The dealer's budget for winners is ``dealer_pool_minor`` plus each loser's
   stake (``drink_water_base`` = ``stakes``, the seed's "dealer pool plus the
   losers' stakes", default), a stake counting no more than the dealer keeps of
   that loser's payment after commission, so the dealer can never lose more than
   the pool; or plus all the dealer keeps of what the losers paid (``paid``: stake
   x the dealer's multiplier, net of commission, an interpretation). Winners
   are paid ``stake x own multiplier`` strongest hand first (equal hands in bet
   order). ``drink_water`` says what happens to the first winner the rest of the
   budget cannot fully pay: ``stop`` (the seed's words, default): it and every
   weaker winner drink water (喝水, ``DRINK_WATER``, stake back); ``skip``: it
   drinks water but weaker winners the rest still covers are paid; ``partial``:
   it is paid what is left (a ``WIN`` for less), every weaker winner drinks water.
4. Commission (``commission.dealer_bps`` / ``commission.player_bps``) is taken
   on the dealer's side from each loser's stake (``commission.dealer_base`` =
   ``stake``, the seed's literal words, default) or from what the dealer wins from
   that loser, stake x the dealer's multiplier (``win``), and from each paid
   winner's winnings;
   a rebate (``rebate_bps`` of the stake, from ``REBATE_EXPENSE``) goes to every bet
   settled as a plain win or loss. The dealer pays ``fees.dealer_minor``,
   ``fees.service_minor`` and ``fees.envelope_minor`` to ``FEES``, one transfer each.

Rounding goes toward the house: what a participant keeps after commission and
the rebate are rounded down; each fraction left behind is recorded in
``Settlement.remainders`` under the bet id. The envelope split itself is the rng
service's (``bull.fairness.split_envelope``); nothing here draws randomness.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from bull import money
from bull.cards import CardError
from bull.rules.config import ConfigError, Settings, as_choice, as_int, check_keys, shown

VARIANT_ID = "red_envelope_bull"

SPECIAL_CATEGORIES = ("baozi", "manniu", "fanshun", "shunzi", "duizi", "jinniu")
POINT_CATEGORIES = tuple(f"points_{n}" for n in range(10, 0, -1))
CATEGORIES = SPECIAL_CATEGORIES + POINT_CATEGORIES  # strongest first
CATEGORY_NAMES: Mapping[str, str] = {
    "baozi": "豹子 Baozi",
    "manniu": "满牛 Manniu",
    "fanshun": "反顺 Fanshun",
    "shunzi": "顺子 Shunzi",
    "duizi": "对子 Duizi",
    "jinniu": "金牛 Jinniu",
    **{f"points_{n}": ("Niu Niu (10 points)" if n == 10 else f"{n} points") for n in range(10, 0, -1)},
}
DEFAULT_MULTIPLIERS: Mapping[str, int] = {
    "baozi": 18,
    "manniu": 15,
    "fanshun": 14,
    "shunzi": 13,
    "duizi": 12,
    "jinniu": 11,
    **{f"points_{n}": n for n in range(10, 0, -1)},
}
_TYPE_RANK: Mapping[str, int] = {
    category: (len(SPECIAL_CATEGORIES) - i if category in SPECIAL_CATEGORIES else 0)
    for i, category in enumerate(CATEGORIES)
}

VOID_AMOUNT_MINOR = 1  # 0.01: voids the round for the dealer, immunity (免死) for a player
MINOR_PER_MAJOR = 100
MAX_AMOUNT_MINOR = 10**12


class AmountError(CardError):
    """An envelope amount that is not a positive number of minor units (this variant's "hand")."""


class BetError(ValueError):
    """A round that cannot be settled as given (duplicate ids, a player betting twice, ...)."""


# ---------------------------------------------------------------------------
# Amounts and hands


def check_amount(amount_minor: int) -> None:
    if type(amount_minor) is not int or not 1 <= amount_minor <= MAX_AMOUNT_MINOR:
        raise AmountError(f"an envelope amount must be 1..{MAX_AMOUNT_MINOR} minor units, not {amount_minor!r}")


def format_amount(amount_minor: int) -> str:
    """Two decimals, as the envelope shows it: 342 -> ``3.42``, 50 -> ``0.50``."""
    whole, cents = divmod(amount_minor, MINOR_PER_MAJOR)
    return f"{whole}.{cents:02d}"


_AMOUNT_TEXT = re.compile(r"[0-9]{1,13}(?:\.[0-9]{1,2})?")


def parse_amount(text: str) -> int:
    """``3.42``, ``RM3.42``, ``0.5`` or ``3`` -> minor units, written as an envelope shows an amount:
    digits and at most two decimals (no exponent: ``1e3`` is not how an amount is written)."""
    cleaned = text.strip().upper().removeprefix("RM").removeprefix("$").strip()
    if not _AMOUNT_TEXT.fullmatch(cleaned):
        raise AmountError(f"not an amount: {shown(text)} (expected digits with at most two decimals, e.g. 3.42)")
    whole, _, cents = cleaned.partition(".")
    amount = int(whole) * MINOR_PER_MAJOR + int(cents.ljust(2, "0"))
    if not 1 <= amount <= MAX_AMOUNT_MINOR:
        raise AmountError(f"an envelope amount must be 0.01..{format_amount(MAX_AMOUNT_MINOR)}, not {shown(text)}")
    return amount


def digits(amount_minor: int) -> tuple[int, ...]:
    """The digits of the amount written with two decimals (0.50 -> 0, 5, 0)."""
    check_amount(amount_minor)
    return tuple(int(ch) for ch in format_amount(amount_minor).replace(".", ""))


def points(amount_minor: int) -> int:
    """Last digit of the digit sum; 0 counts as 10 (Niu Niu)."""
    return sum(digits(amount_minor)) % 10 or 10


def _steps(ds: Sequence[int], step: int) -> bool:
    return all(b - a == step for a, b in pairwise(ds))


def category_of(amount_minor: int) -> str:
    """The strongest category the amount meets."""
    ds = digits(amount_minor)
    if len(set(ds)) == 1:
        return "baozi"
    if amount_minor % MINOR_PER_MAJOR == 0:
        return "manniu"
    if _steps(ds, -1):
        return "fanshun"
    if _steps(ds, 1):
        return "shunzi"
    if ds[-1] == ds[-2]:
        return "duizi"
    if ds[0] == 0 and ds[-1] == 0:
        return "jinniu"
    return f"points_{points(amount_minor)}"


@dataclass(frozen=True, slots=True)
class EnvelopeHand:
    amount_minor: int
    category: str
    points: int

    @property
    def key(self) -> tuple[int, int, int, int]:
        """Orders hands: type, then (Duizi only) the last-two-digit number, then points, then amount."""
        pair = self.amount_minor % 100 if self.category == "duizi" else 0
        return (_TYPE_RANK[self.category], pair, self.points, self.amount_minor)

    @property
    def text(self) -> str:
        return format_amount(self.amount_minor)


def evaluate(amount_minor: int) -> EnvelopeHand:
    return EnvelopeHand(amount_minor, category_of(amount_minor), points(amount_minor))


def compare(a: EnvelopeHand, b: EnvelopeHand) -> int:
    """1 if ``a`` beats ``b``, 0 tie (same amount), -1 if ``b`` wins. A total order."""
    return (a.key > b.key) - (a.key < b.key)


def compare_reason(a: EnvelopeHand, b: EnvelopeHand) -> str:
    if a.key[0] != b.key[0]:
        return "card type"
    if a.key[1] != b.key[1]:
        return "last two digits (duizi)"
    if a.points != b.points:
        return "points"
    if a.amount_minor != b.amount_minor:
        return "amount"
    return "equal amounts"


# ---------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True, slots=True)
class RedEnvelopeConfig:
    """Validated settings; build it with :func:`load_config` from dotted keys."""

    multipliers: tuple[tuple[str, int], ...] = tuple(DEFAULT_MULTIPLIERS.items())
    dealer_commission_bps: int = 500
    player_commission_bps: int = 500
    rebate_bps: int = 70
    dealer_fee_minor: int = 0
    service_fee_minor: int = 0
    envelope_fee_minor: int = 0
    envelope_total_minor: int = 1000  # what the rng service is asked to split (reports use it too)
    dealer_commission_base: str = "stake"  # DEALER_COMMISSION_BASES: what the dealer-side bps apply to
    drink_water: str = "stop"  # DRINK_WATER_RULES: the first winner the budget cannot fully pay, and after
    drink_water_base: str = "stakes"  # DRINK_WATER_BASES: what each loser adds to the budget for winners

    def __post_init__(self) -> None:
        if self.dealer_commission_base not in DEALER_COMMISSION_BASES:
            raise ConfigError("commission.dealer_base", f"expected one of {', '.join(DEALER_COMMISSION_BASES)}")
        if self.drink_water not in DRINK_WATER_RULES:
            raise ConfigError("drink_water", f"expected one of {', '.join(DRINK_WATER_RULES)}")
        if self.drink_water_base not in DRINK_WATER_BASES:
            raise ConfigError("drink_water_base", f"expected one of {', '.join(DRINK_WATER_BASES)}")

    def multiplier(self, category: str) -> int:
        return dict(self.multipliers)[category]

    @property
    def max_multiplier(self) -> int:
        return max(m for _, m in self.multipliers)

    @property
    def dealer_fees_minor(self) -> int:
        return self.dealer_fee_minor + self.service_fee_minor + self.envelope_fee_minor


# "stake": the seed's "the platform takes a 5% cut from that stake"; "win": 5% of stake x dealer multiplier.
DEALER_COMMISSION_BASES = ("stake", "win")
# "stop": the seed's 喝水 (the rest drink water from the first winner not fully covered); "skip": weaker
# winners the rest still covers are paid; "partial": the first winner not covered gets what is left.
DRINK_WATER_RULES = ("stop", "skip", "partial")
# "stakes": the seed's budget, the dealer pool plus the losers' stakes (never more of a loser than the
# dealer keeps of what it paid); "paid": the pool plus what the losers paid the dealer, net of commission.
DRINK_WATER_BASES = ("stakes", "paid")

DEFAULT_CONFIG = RedEnvelopeConfig()

_SCALARS = {
    "commission.dealer_bps": ("dealer_commission_bps", 0, money.BPS_DENOMINATOR),
    "commission.player_bps": ("player_commission_bps", 0, money.BPS_DENOMINATOR),
    "rebate_bps": ("rebate_bps", 0, money.BPS_DENOMINATOR),
    "fees.dealer_minor": ("dealer_fee_minor", 0, 10**12),
    "fees.service_minor": ("service_fee_minor", 0, 10**12),
    "fees.envelope_minor": ("envelope_fee_minor", 0, 10**12),
    "envelope.total_minor": ("envelope_total_minor", 2, 10**9),
}
_CHOICES = {
    "commission.dealer_base": ("dealer_commission_base", DEALER_COMMISSION_BASES),
    "drink_water": ("drink_water", DRINK_WATER_RULES),
    "drink_water_base": ("drink_water_base", DRINK_WATER_BASES),
}
CONFIG_KEYS = tuple(f"multipliers.{c}" for c in CATEGORIES) + tuple(_SCALARS) + tuple(_CHOICES)
MAX_MULTIPLIER = 10_000


def load_config(settings: Settings | None = None) -> RedEnvelopeConfig:
    """Build a config from dotted keys (nested tables allowed); unknown keys are errors."""
    flat = check_keys(settings or {}, CONFIG_KEYS)
    multipliers = tuple(
        (
            c,
            as_int(f"multipliers.{c}", flat[f"multipliers.{c}"], low=1, high=MAX_MULTIPLIER)
            if f"multipliers.{c}" in flat
            else m,
        )
        for c, m in DEFAULT_MULTIPLIERS.items()
    )
    base = DEFAULT_CONFIG

    def number(key: str) -> int:
        name, low, high = _SCALARS[key]
        return as_int(key, flat[key], low=low, high=high) if key in flat else int(getattr(base, name))

    def choice(key: str) -> str:
        name, options = _CHOICES[key]
        return as_choice(key, flat[key], options) if key in flat else str(getattr(base, name))

    return RedEnvelopeConfig(
        multipliers=multipliers,
        dealer_commission_bps=number("commission.dealer_bps"),
        player_commission_bps=number("commission.player_bps"),
        rebate_bps=number("rebate_bps"),
        dealer_fee_minor=number("fees.dealer_minor"),
        service_fee_minor=number("fees.service_minor"),
        envelope_fee_minor=number("fees.envelope_minor"),
        envelope_total_minor=number("envelope.total_minor"),
        dealer_commission_base=choice("commission.dealer_base"),
        drink_water=choice("drink_water"),
        drink_water_base=choice("drink_water_base"),
    )


def config_settings(config: RedEnvelopeConfig) -> dict[str, str]:
    """The dotted-key form of a config (round-trips through :func:`load_config`)."""
    out = {f"multipliers.{c}": str(m) for c, m in config.multipliers}
    out.update({key: str(getattr(config, name)) for key, (name, _, _) in _SCALARS.items()})
    out.update({key: str(getattr(config, name)) for key, (name, _) in _CHOICES.items()})
    return out


# ---------------------------------------------------------------------------
# Settlement


@dataclass(frozen=True, slots=True)
class EnvelopeBet:
    """A player's bet against the dealer and the amount that player grabbed."""

    bet_id: str
    player: str
    stake_minor: int
    amount_minor: int


@dataclass(frozen=True, slots=True)
class EnvelopeRound:
    dealer: str
    dealer_pool_minor: int
    dealer_amount_minor: int
    bets: tuple[EnvelopeBet, ...]


AREA = "dealer"  # every bet is against the dealer


def hold_minor(stake_minor: int, config: RedEnvelopeConfig = DEFAULT_CONFIG) -> int:
    """The player's worst case: losing to the strongest multiplier (x18 by default)."""
    return stake_minor * config.max_multiplier


def dealer_hold_minor(dealer_pool_minor: int, config: RedEnvelopeConfig = DEFAULT_CONFIG) -> int:
    """The dealer's worst case: the whole pool plus the three fees."""
    return dealer_pool_minor + config.dealer_fees_minor


def check_round(rnd: EnvelopeRound) -> None:
    """Raise BetError (or AmountError) unless the round can be settled."""
    if type(rnd.dealer_pool_minor) is not int or rnd.dealer_pool_minor < 0:
        raise BetError(f"dealer pool must be a non-negative integer, not {rnd.dealer_pool_minor!r}")
    check_amount(rnd.dealer_amount_minor)
    parties = [rnd.dealer, *(bet.player for bet in rnd.bets)]
    if len(set(parties)) != len(parties):
        raise BetError("each player bets once, and the dealer does not bet")
    if any(party in money.SYSTEM_ACCOUNTS for party in parties):
        raise BetError("a system account cannot take part in a round")
    if len({bet.bet_id for bet in rnd.bets}) != len(rnd.bets):
        raise BetError("bet ids must be unique")
    for bet in rnd.bets:
        if type(bet.stake_minor) is not int or bet.stake_minor <= 0:
            raise BetError(f"bet {bet.bet_id}: stake must be a positive integer, not {bet.stake_minor!r}")
        check_amount(bet.amount_minor)


def keep_after_bps(amount_minor: int, bps: int) -> tuple[int, int]:
    """What is left of ``amount_minor`` after a ``bps`` cut, rounded down; and the remainder numerator."""
    return money.floor_div_toward_house(amount_minor * (money.BPS_DENOMINATOR - bps), money.BPS_DENOMINATOR)


def dealer_keeps(stake_minor: int, pay_minor: int, config: RedEnvelopeConfig) -> tuple[int, int]:
    """What the dealer keeps of a loser's ``pay_minor`` after the dealer-side commission, rounded down.

    Returns (kept, remainder numerator over ``BPS_DENOMINATOR``). The commission is
    ``commission.dealer_bps`` of the stake (base ``stake``) or of the whole payment
    (base ``win``); it never exceeds the payment, since every multiplier is at least 1.
    """
    if config.dealer_commission_base == "win":
        return keep_after_bps(pay_minor, config.dealer_commission_bps)
    cut = stake_minor * config.dealer_commission_bps
    return money.floor_div_toward_house(pay_minor * money.BPS_DENOMINATOR - cut, money.BPS_DENOMINATOR)


def budget_share(stake_minor: int, kept_minor: int, config: RedEnvelopeConfig) -> int:
    """What one loser adds to the dealer's budget for winners: its stake (``drink_water_base`` =
    ``stakes``), never more than the dealer kept of its payment, so the dealer never pays winners
    beyond the pool; or all the dealer kept of it (``paid``)."""
    return kept_minor if config.drink_water_base == "paid" else min(stake_minor, kept_minor)


@dataclass(slots=True)
class _Book:
    """Mutable scratch space while one settlement is assembled (never escapes ``settle``)."""

    config: RedEnvelopeConfig
    results: dict[str, money.BetResult] = field(default_factory=dict)
    transfers: list[money.Transfer] = field(default_factory=list)
    remainders: list[tuple[str, int, int]] = field(default_factory=list)

    def move(self, payer: str, payee: str, amount: int, kind: money.TransferKind, bet_id: str | None) -> None:
        if amount > 0:
            self.transfers.append(money.Transfer(payer, payee, amount, kind, bet_id))

    def remainder(self, bet_id: str, numerator: int, denominator: int) -> None:
        if numerator:
            self.remainders.append((bet_id, numerator, denominator))

    def result(self, bet: EnvelopeBet, outcome: money.Outcome, net: int) -> None:
        hold = hold_minor(bet.stake_minor, self.config)
        self.results[bet.bet_id] = money.BetResult(bet.bet_id, bet.player, AREA, bet.stake_minor, hold, outcome, net)

    def rebate(self, bet: EnvelopeBet) -> int:
        amount, rest = money.floor_div_toward_house(bet.stake_minor * self.config.rebate_bps, money.BPS_DENOMINATOR)
        self.move(money.REBATE_EXPENSE, bet.player, amount, money.TransferKind.REBATE, bet.bet_id)
        self.remainder(bet.bet_id, rest, money.BPS_DENOMINATOR)
        return amount


def _strength(bet: EnvelopeBet) -> tuple[int, int, int, int]:
    return evaluate(bet.amount_minor).key


def settle(rnd: EnvelopeRound, config: RedEnvelopeConfig = DEFAULT_CONFIG) -> money.Settlement:
    """Settle one round (see the module docstring for the order of the steps)."""
    check_round(rnd)
    book = _Book(config)
    if rnd.dealer_amount_minor == VOID_AMOUNT_MINOR:
        for bet in rnd.bets:
            book.result(bet, money.Outcome.REFUND, 0)
        return money.Settlement(tuple(book.results[b.bet_id] for b in rnd.bets), ()).check()

    dealer_hand = evaluate(rnd.dealer_amount_minor)
    dealer_multiplier = config.multiplier(dealer_hand.category)
    winners: list[EnvelopeBet] = []
    budget = rnd.dealer_pool_minor
    for bet in rnd.bets:
        result = compare(evaluate(bet.amount_minor), dealer_hand)
        if result > 0:
            winners.append(bet)
        elif result == 0:
            book.result(bet, money.Outcome.PUSH, 0)
        elif bet.amount_minor == VOID_AMOUNT_MINOR:
            book.result(bet, money.Outcome.IMMUNE, 0)
        else:
            pay = bet.stake_minor * dealer_multiplier
            kept, rest = dealer_keeps(bet.stake_minor, pay, config)
            book.move(bet.player, rnd.dealer, pay, money.TransferKind.LOSS, bet.bet_id)
            book.move(rnd.dealer, money.COMMISSION_REVENUE, pay - kept, money.TransferKind.COMMISSION, bet.bet_id)
            book.remainder(bet.bet_id, rest, money.BPS_DENOMINATOR)
            book.result(bet, money.Outcome.LOSS, book.rebate(bet) - pay)
            budget += budget_share(bet.stake_minor, kept, config)

    # sorted() is stable with reverse=True: equal hands keep bet order.
    stopped = False
    for bet in sorted(winners, key=_strength, reverse=True):
        gross = bet.stake_minor * config.multiplier(evaluate(bet.amount_minor).category)
        if gross > budget and not stopped:
            stopped = config.drink_water != "skip"
            gross = budget if config.drink_water == "partial" else 0
        elif stopped:
            gross = 0
        if gross == 0:
            book.result(bet, money.Outcome.DRINK_WATER, 0)
            continue
        budget -= gross
        kept, rest = keep_after_bps(gross, config.player_commission_bps)
        book.move(rnd.dealer, bet.player, gross, money.TransferKind.WIN, bet.bet_id)
        book.move(bet.player, money.COMMISSION_REVENUE, gross - kept, money.TransferKind.COMMISSION, bet.bet_id)
        book.remainder(bet.bet_id, rest, money.BPS_DENOMINATOR)
        book.result(bet, money.Outcome.WIN, kept + book.rebate(bet))

    for amount, kind in (
        (config.dealer_fee_minor, money.TransferKind.DEALER_FEE),
        (config.service_fee_minor, money.TransferKind.SERVICE_FEE),
        (config.envelope_fee_minor, money.TransferKind.ENVELOPE_FEE),
    ):
        book.move(rnd.dealer, money.FEES, amount, kind, None)
    results = tuple(book.results[bet.bet_id] for bet in rnd.bets)
    return money.Settlement(results, tuple(book.transfers), tuple(book.remainders)).check()
