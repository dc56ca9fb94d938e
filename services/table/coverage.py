"""Whether the wallet's holds cover a settlement, checked before the table publishes it.

The wallet applies a round's RoundSettled whole or not at all: one transfer from a
hold that is missing, resolved, another account's or another round's, or smaller
than what the settlement takes from it, and it refuses the whole round (nobody is
paid, every hold stays frozen). So before it settles, the table reads the round's
holds from the wallet (``WalletPort.read_holds``) and applies the rule written in
docs/settlement.md:

* a bet is **covered** when its hold exists, is open, is the bettor's, is of this
  round (or of none), and holds at least what the table recorded for it
  (``hold_minor``) and what the settlement takes from it;
* an uncovered bet is refunded: its stake is treated as never accepted, it is left
  out of the settlement (the rest of the round is settled without it) and its hold,
  still listed with the round's holds, is released by the wallet if it is open;
* when the dealer's or banker's hold is not covered the same way (open, theirs, of
  this round, at least what the table recorded and what the settlement takes), no
  bet can be left out to mend that: the round is voided (every hold released).

These functions are pure: the settlement and the holds come in, the verdict goes out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from bull.money import Settlement
from bull.variants import Funding, TableBet
from services.table.ports import WalletHold


@dataclass(frozen=True, slots=True)
class Need:
    """What a settlement needs of one hold: whose it is and how much it must hold."""

    account: str
    amount_minor: int


def refusal(hold: WalletHold | None, need: Need, round_id: str) -> str:
    """Why the wallet would refuse to take ``need`` from ``hold`` ("" when it would not): its reason code."""
    if hold is None:
        return "HOLD_NOT_FOUND"
    if not hold.is_open:
        return "HOLD_NOT_OPEN"
    if hold.account != need.account:
        return "HOLD_WRONG_ACCOUNT"
    if hold.round_id not in ("", round_id):
        return "HOLD_ROUND_MISMATCH"
    if hold.amount_minor < need.amount_minor:
        return "HOLD_INSUFFICIENT"
    return ""


def needs(settlement: Settlement, recorded: Mapping[str, Need]) -> dict[str, Need]:
    """Per hold: the larger of what the table recorded for it and what the settlement takes from it."""
    taken: dict[str, int] = defaultdict(int)
    payers: dict[str, str] = {}
    for t in settlement.transfers:
        if t.hold_id:
            taken[t.hold_id] += t.amount_minor
            payers[t.hold_id] = t.payer
    wanted = dict(recorded)
    for hold_id, amount in taken.items():
        known = wanted.get(hold_id)
        account = known.account if known is not None else payers[hold_id]
        wanted[hold_id] = Need(account, max(amount, known.amount_minor if known else 0))
    return wanted


@dataclass(frozen=True, slots=True)
class Verdict:
    """The settlement of the covered bets, the bets refunded (bet id -> reason), and why the round
    cannot be settled at all ("" when it can)."""

    settlement: Settlement | None
    live: tuple[TableBet, ...]
    refunded: Mapping[str, str]
    void_reason: str = ""


def covered_settlement(
    settle: Callable[[Sequence[TableBet]], Settlement],
    live: Sequence[TableBet],
    recorded: Mapping[str, Need],
    funding: Funding,
    holds: Mapping[str, WalletHold],
    round_id: str,
) -> Verdict:
    """Settle ``live`` without the bets the wallet's ``holds`` do not cover.

    ``recorded``: per bet's hold id, the bettor and the ``hold_minor`` the table recorded (the
    dealer's hold is recorded in ``funding``). Leaving
    a bet out changes what the others take (a red-envelope dealer pays from the losers' payments),
    so the settlement is made again until every hold covers it: at most once per bet, since each
    pass leaves at least one out.
    """
    bets = list(live)
    refunded: dict[str, str] = {}
    dealer: dict[str, Need] = {}
    if funding.dealer_hold_id:
        dealer = {funding.dealer_hold_id: Need(funding.dealer, funding.dealer_hold_minor)}
    for _ in range(len(bets) + 1):
        settlement = settle(bets)
        wanted = needs(settlement, {b.hold_id: recorded[b.hold_id] for b in bets} | dealer)
        reasons = {h: refusal(holds.get(h), need, round_id) for h, need in wanted.items()}
        if funding.dealer_hold_id and reasons.get(funding.dealer_hold_id):
            reason = reasons[funding.dealer_hold_id]
            return Verdict(None, tuple(bets), refunded, f"{reason}: the hold {funding.dealer_hold_id} does not cover")
        dropped = {b.bet_id: reasons[b.hold_id] for b in bets if reasons.get(b.hold_id)}
        if not dropped:
            return Verdict(settlement, tuple(bets), refunded)
        refunded |= dropped
        bets = [b for b in bets if b.bet_id not in dropped]
    raise AssertionError("every pass leaves a bet out, so the loop ends before its bound")
