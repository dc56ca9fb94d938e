"""What ``decide`` is asked: a player's command, the rng's answer, or only that time has passed.

A command carries everything the decision needs from outside the round (the rng's deck or
split, the jackpot pool's payable balance): the core asks nobody.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.table.core.state import Bet, Bid


@dataclass(frozen=True, slots=True)
class Tick:
    """Time has passed: close a window whose deadline is past, reveal what is due."""


@dataclass(frozen=True, slots=True)
class PlaceBet:
    """A bet the admission (``admission.verify_bet``) accepted and the wallet holds."""

    bet: Bet


@dataclass(frozen=True, slots=True)
class CancelBet:
    bet_id: str
    cause: str = "player"


@dataclass(frozen=True, slots=True)
class ChangeBet:
    """A red-envelope bettor's new stake (and the hold it is now under)."""

    bet_id: str
    stake_minor: int
    hold_minor: int
    hold_id: str


@dataclass(frozen=True, slots=True)
class PlaceBid:
    bid: Bid


@dataclass(frozen=True, slots=True)
class Deal:
    """The rng's shuffled deck (card codes) for a card round."""

    deck: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Split:
    """The rng's envelope split: one share per participant (position 0 the dealer) and the grab order."""

    amounts: tuple[int, ...]
    grab_order: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RngFailed:
    """The rng did not deal (or split) this time; ``refused``: it refused the envelope's split outright
    (an envelope error at once, where a round otherwise waits ``RNG_PATIENCE_MS`` for the rng)."""

    refused: bool = False


@dataclass(frozen=True, slots=True)
class Settle:
    """Settle the revealed round: ``pool_minor`` is the jackpot pool's payable balance when the
    variant claims it; ``refunded`` the bets the wallet's holds do not cover (``coverage.py``)."""

    pool_minor: int | None = None
    refunded: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Void:
    """End the round now, every hold released: an admin closing the table, or a dealer's hold the
    wallet says does not cover the settlement (``coverage.py``)."""

    reason: str


Command = Tick | PlaceBet | CancelBet | ChangeBet | PlaceBid | Deal | Split | RngFailed | Settle | Void
