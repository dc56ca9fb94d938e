"""A bet's admission, stated once: ``verify_bet`` over the facts a bet is checked against.

The same rule answers twice for each bet: on the facts read before the wallet holds it
(``TableStore.bet_contexts``) and on the facts the statement that records it returns
(``TableStore.record_bet``), whose SQL guard admits exactly the bets this rule admits
(``tests/table/test_admission_sql.py`` runs both on random facts). The first answer spares
the wallet a hold for a bet that would be refused; the second names the refusal of a bet
the guard did not record, as the facts were when it tried.

Pure: no clock (``now`` is a fact), no I/O, no metrics; the caller counts and raises the
refusal (``Refusal.error``). What a bet gets wrong whatever the state (its amount against
the table's terms) is checked apart, before any of this (``check_amount``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from backbone.errors import FailedPrecondition

BETTING = "betting"
"""The phase that takes bets (``Phase.BETTING``)."""


class BetRefused(FailedPrecondition):
    """A bet the round does not take as things stand (``verify_bet``'s refusal, raised)."""


@dataclass(frozen=True)
class Bounds:
    """The limits a bet is admitted under: the table's maximum a player and round (the round's limits),
    and the bounds on a round's bets and on a player's bets in it (any status)."""

    max_staked_minor: int
    max_round_bets: int
    max_player_bets: int


@dataclass(frozen=True)
class BetFacts:
    """What a bet is admitted against: the round's phase and betting deadline (phase None: no round),
    the instant of the check, the round's id; what the player had staked in it (open bets), how many
    bets the round and the player there had taken (any status), the player's open bets there; the
    bounds; and the shape's rule: one open bet a player and round (``RoundMachine.one_bet_per_round``)."""

    phase: str | None
    closes_at: datetime | None
    now: datetime
    round_id: str
    staked_minor: int
    round_bets: int
    player_bets: int
    player_open_bets: int
    bounds: Bounds
    one_bet_per_round: bool = False


@dataclass(frozen=True)
class Order:
    """The bet being admitted: its amount, and the round it was sent for ("" for whichever takes bets)."""

    amount_minor: int
    round_id: str = ""


@dataclass(frozen=True)
class Refusal:
    """Why a bet is not taken: the reason a client reads and a sentence for a person."""

    reason: str
    message: str

    def error(self) -> BetRefused:
        return BetRefused(self.reason, self.message)


def window_open(window: tuple[str, Any] | None, now: Any) -> bool:
    """The round (its phase and betting deadline; None: no round) takes bets: it is betting and its
    deadline is still ahead."""
    return window is not None and window[0] == BETTING and now < window[1]


def verify_bet(facts: BetFacts, order: Order) -> Refusal | None:
    """The refusal of ``order`` on ``facts``, or None when the bet is taken. In this order: the betting
    window, the round asked for, the round's and the player's bounds on bets, the table maximum against
    the player's stakes, the shape's one bet a round."""
    bounds = facts.bounds
    window = None if facts.phase is None or facts.closes_at is None else (facts.phase, facts.closes_at)
    if not window_open(window, facts.now):
        return Refusal("BETTING_CLOSED", "no round is taking bets at this table right now")
    if order.round_id and order.round_id != facts.round_id:
        return Refusal("ROUND_MISMATCH", f"round {order.round_id} is not the round taking bets")
    if facts.round_bets >= bounds.max_round_bets:
        return Refusal("ROUND_FULL", f"this round has taken its {bounds.max_round_bets} bets; bet in the next one")
    if facts.player_bets >= bounds.max_player_bets:
        return Refusal(
            "PLAYER_ROUND_FULL",
            f"you have placed {bounds.max_player_bets} bets this round (cancelled ones count); bet in the next one",
        )
    if facts.staked_minor + order.amount_minor > bounds.max_staked_minor:
        staked = facts.staked_minor
        return Refusal(
            "ABOVE_TABLE_MAXIMUM",
            f"the table maximum is {bounds.max_staked_minor} per player and round; {staked} already staked",
        )
    if facts.one_bet_per_round and facts.player_open_bets:
        return Refusal("ALREADY_BET", "you have bet this round: change that bet with ChangeBet, or 0 to cancel")
    return None
