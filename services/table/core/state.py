"""A round's state, as ``evolve`` folds it from the round's events.

The public part comes from the events every watcher may read. The sealed part (``Secret``:
the deck or the envelope's grabs, and when the next reveal is due) is what the table alone
knows; ``decide`` emits it as a private fact (``Sealed``, ``Scheduled``) that the machines
store with the round's row and never publish, so no card or share leaves before its reveal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from niuniu.table.v1 import events_pb2 as ev


class Phase:
    BIDDING = "bidding"  # red-envelope bull: the dealer seat is bid for before betting
    BETTING = "betting"
    DEALING = "dealing"
    REVEALING = "revealing"
    SETTLING = "settling"
    SETTLED = "settled"
    VOIDED = "voided"
    ENDED = (SETTLED, VOIDED)


PHASE_ORDER = {
    Phase.BIDDING: 0,
    Phase.BETTING: 1,
    Phase.DEALING: 2,
    Phase.REVEALING: 3,
    Phase.SETTLING: 4,
    Phase.SETTLED: 5,
    Phase.VOIDED: 5,
}
"""Phases only move forward: a round never goes back to a phase of a lower rank."""


@dataclass(frozen=True, slots=True)
class Bet:
    """A bet as its events tell it: placed (changed), cancelled, settled or refunded."""

    bet_id: str
    player: str
    area: str
    stake_minor: int
    hold_minor: int
    hold_id: str
    client_seed: str = ""
    status: str = "placed"
    outcome: str = ""
    net_minor: int = 0


@dataclass(frozen=True, slots=True)
class Bid:
    """A red-envelope dealer bid."""

    bid_id: str
    player: str
    amount_minor: int
    hold_minor: int
    hold_id: str


@dataclass(frozen=True, slots=True)
class Grab:
    """One share of a sent envelope, in grab order: who grabs it (position 0 the dealer) and how much."""

    grab_no: int
    position: int
    participant: str
    bet_id: str
    amount_minor: int


@dataclass(frozen=True, slots=True)
class Sealed:
    """A private fact: the round's deck (card codes, in deck order) or its envelope's grabs."""

    deck: tuple[str, ...] = ()
    grabs: tuple[Grab, ...] = ()


@dataclass(frozen=True, slots=True)
class Scheduled:
    """A private fact: when the round's next reveal is due (unix ms)."""

    at_ms: int


@dataclass(frozen=True, slots=True)
class RoundState:
    """One round. ``variant`` and ``config`` (the table's settings as text) are fixed at its opening."""

    table_id: str
    round_id: str
    variant: str
    config: tuple[tuple[str, str], ...] = ()
    limits: ev.TableLimits = field(default_factory=ev.TableLimits)
    round_no: int = 0
    phase: str = ""
    commitment: str = ""
    betting_closes_at_ms: int = 0
    bidding_closes_at_ms: int = 0
    next_step_at_ms: int = 0
    redeal_of: str = ""
    bets: tuple[Bet, ...] = ()
    staked: tuple[tuple[str, int], ...] = ()
    """The stakes by area of the bets not cancelled, areas in the order first bet on; an area whose bets were
    all cancelled stays, at 0. ``evolve`` keeps it as bets move, so a reader after every bet (WatchTable)
    does not add up the round's bets each time."""
    live_bets: int = 0
    """How many of ``bets`` are not cancelled."""
    bids: tuple[Bid, ...] = ()
    dealer: str = ""
    dealer_hold_id: str = ""
    dealer_hold_minor: int = 0
    dealer_pool_minor: int = 0
    table_cap_minor: int = 0
    client_seed: str = ""
    server_seed: str = ""
    reveals_planned: int = 0
    hands: tuple[ev.HandRevealed, ...] = ()
    grabs: tuple[ev.EnvelopeGrabbed, ...] = ()
    envelope_total_minor: int = 0
    envelope_min_minor: int = 0
    settled: ev.RoundSettled | None = None
    void_reason: str = ""
    sealed: Sealed = Sealed()

    @property
    def reveals_done(self) -> int:
        return len(self.hands) + len(self.grabs)

    @property
    def settings(self) -> dict[str, str]:
        return dict(self.config)

    @property
    def placed(self) -> tuple[Bet, ...]:
        """The bets still in play (neither cancelled nor refunded nor settled)."""
        return tuple(b for b in self.bets if b.status == "placed")

    @property
    def highest_bid_minor(self) -> int:
        return max((b.amount_minor for b in self.bids), default=0)

    @property
    def leading_bid(self) -> Bid | None:
        """The bid that deals if bidding closed now: the highest, the first of equals."""
        best: Bid | None = None
        for bid in self.bids:
            if best is None or bid.amount_minor > best.amount_minor:
                best = bid
        return best
