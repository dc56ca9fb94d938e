"""The table's game-integrity metrics: what settled rounds returned to players, and whether rounds end.

Return to player (RTP) per variant and bet type, for the alert that compares it with
the math report (``deploy/observability/game_integrity.py`` generates the report's
figures into the rules). Counted when a round's settlement has committed, in integer
minor units, per bet type (``BET_TYPES``) and configuration (``default`` when the
table runs the variant's default configuration, the one the reports' headline
figures are for; ``custom`` otherwise):

- ``niuniu_table_settled_stake_minor_total``: stakes of the settled bets;
- ``niuniu_table_settled_won_minor_total`` / ``..._lost_minor_total``: the players'
  net wins and net losses (a loss may exceed the stake: Golden Bull's authentic mode),
  so RTP = 1 + (won - lost) / stake over any window, and what went back to the
  players is stake + won - lost;
- ``niuniu_table_settled_stake_squares_total``: per round, the square of the round's
  total stake on the bet type. Every bet on one bet type in a round shares the
  dealer's hand, so a round is one sample of size (its stake); with
  n = stake^2 / sum of squares, the RTP's standard error is sqrt(variance / n) for
  the report's per-unit variance, an upper bound whatever the bets' correlation.

Rounds stalled: ``niuniu_table_last_round_ended_timestamp_seconds{table}`` is set when
this process takes a table (so it exists before the first round ends) and whenever a
round ends (settled or voided); ``niuniu_table_round_wait_seconds{table}`` is how long
the table's rounds are configured to wait (bidding + betting + pause), which the alert
allows on top of its margin.

Every function here is called after the database transaction committed: a process that
dies in between loses that round's increments (never counts one twice).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from niuniu.table.v1 import events_pb2 as ev
from prometheus_client import Counter, Gauge

from bull.money import Outcome
from bull.rules import bai_buu as bu
from bull.rules import baibian_bull as bb
from bull.rules import golden_bull as gb
from bull.variants import Variant
from bull.variants import red_envelope_bull as rev

# variant -> area -> the bet type the math report gives an RTP and a variance for.
BET_TYPES: Mapping[str, Mapping[str, str]] = {
    gb.VARIANT_ID: dict.fromkeys(gb.AREAS, "area"),
    bb.VARIANT_ID: dict.fromkeys(bb.AREAS, "area"),
    bu.VARIANT_ID: dict.fromkeys(bu.BANKER_AREAS, "banker")
    | dict.fromkeys(bu.PLAYER_AREAS, "player")
    | dict.fromkeys(bu.JACKPOT_AREAS, "jackpot"),
    rev.RED_ENVELOPE_BULL.variant_id: {rev.AREA: "player"},
}
DEFAULT_CONFIG = "default"
CUSTOM_CONFIG = "custom"
_LABELS = ["variant", "bet", "config"]

SETTLED_STAKE = Counter(
    "niuniu_table_settled_stake_minor_total", "Stakes of settled bets, minor units, by variant and bet type.", _LABELS
)
SETTLED_WON = Counter(
    "niuniu_table_settled_won_minor_total", "Players' net wins on settled bets, minor units.", _LABELS
)
SETTLED_LOST = Counter(
    "niuniu_table_settled_lost_minor_total", "Players' net losses on settled bets, minor units.", _LABELS
)
SETTLED_STAKE_SQUARES = Counter(
    "niuniu_table_settled_stake_squares_total",
    "Sum over settled rounds of the square of the round's stake on the bet type (minor units squared).",
    _LABELS,
)
LAST_ROUND_ENDED = Gauge(
    "niuniu_table_last_round_ended_timestamp_seconds",
    "When a round of the table last ended (settled or voided), or this process took the table.",
    ["table"],
)
SETTLEMENT_CHECKS = Counter(
    "niuniu_table_settlement_checks_total",
    "Rounds whose holds the table checked with the wallet before settling, by result: covered, refunded"
    " (bets the holds did not cover were left out), voided (the dealer's hold did not cover), unchecked"
    " (the wallet did not answer in time: settled as recorded).",
    ["result"],
)
BETS_REFUNDED_UNCOVERED = Counter(
    "niuniu_table_bets_refunded_uncovered_total",
    "Bets refunded when their round settled because the wallet's hold did not cover them, by the reason"
    " the wallet would have refused (HOLD_NOT_OPEN, HOLD_INSUFFICIENT ...).",
    ["reason"],
)
ROUND_WAIT = Gauge(
    "niuniu_table_round_wait_seconds",
    "The waits a round of the table is configured with (bidding + betting + pause), seconds.",
    ["table"],
)

for _variant, _areas in BET_TYPES.items():  # series exist from the start, so the first round shows in increase()
    for _bet in sorted(set(_areas.values())):
        for _config in (DEFAULT_CONFIG, CUSTOM_CONFIG):
            for _counter in (SETTLED_STAKE, SETTLED_WON, SETTLED_LOST, SETTLED_STAKE_SQUARES):
                _counter.labels(_variant, _bet, _config)

_DEFAULT_SETTINGS: dict[str, dict[str, str]] = {}


def bet_type(variant_id: str, area: str) -> str:
    return BET_TYPES.get(variant_id, {}).get(area, "other")


def config_label(variant: Variant[Any], config: Any) -> str:
    """``default`` when ``config`` is the variant's default configuration (what the reports' figures are for)."""
    default = _DEFAULT_SETTINGS.get(variant.variant_id)
    if default is None:
        default = _DEFAULT_SETTINGS[variant.variant_id] = variant.config_settings(variant.parse_config({}))
    return DEFAULT_CONFIG if variant.config_settings(config) == default else CUSTOM_CONFIG


@dataclass
class Tally:
    """One round's settled bets of one bet type: the increments of the four counters."""

    stake_minor: int = 0
    won_minor: int = 0
    lost_minor: int = 0

    @property
    def stake_square(self) -> int:
        return self.stake_minor * self.stake_minor


class SettledBet(Protocol):
    """A settled bet: a ``BetResult`` of the kernel's ``Settlement``, or a ``BetOutcome`` of ``RoundSettled``."""

    @property
    def area(self) -> str: ...
    @property
    def stake_minor(self) -> int: ...
    @property
    def net_minor(self) -> int: ...
    @property
    def outcome(self) -> str: ...


class Settled(Protocol):
    """A settlement's bets: the kernel's ``Settlement`` or the ``RoundSettled`` event."""

    @property
    def bets(self) -> Sequence[SettledBet]: ...


def tally(variant_id: str, settlement: Settled) -> dict[str, Tally]:
    """Bet type -> what the round's settled bets add (refunds are not play and count nowhere)."""
    out: dict[str, Tally] = {}
    for bet in settlement.bets:
        if bet.outcome == Outcome.REFUND:
            continue
        counts = out.setdefault(bet_type(variant_id, bet.area), Tally())
        counts.stake_minor += bet.stake_minor
        counts.won_minor += max(bet.net_minor, 0)
        counts.lost_minor += max(-bet.net_minor, 0)
    return out


def round_settled(table_id: str, variant: Variant[Any], config: Any, settlement: Settled, at: datetime) -> None:
    """Count a committed settlement's bets and mark the table's round as ended."""
    labels = (variant.variant_id, config_label(variant, config))
    for kind, counts in tally(variant.variant_id, settlement).items():
        SETTLED_STAKE.labels(labels[0], kind, labels[1]).inc(counts.stake_minor)
        SETTLED_WON.labels(labels[0], kind, labels[1]).inc(counts.won_minor)
        SETTLED_LOST.labels(labels[0], kind, labels[1]).inc(counts.lost_minor)
        SETTLED_STAKE_SQUARES.labels(labels[0], kind, labels[1]).inc(counts.stake_square)
    round_ended(table_id, at)


def round_ended(table_id: str, at: datetime) -> None:
    LAST_ROUND_ENDED.labels(table_id).set(at.timestamp())


def table_started(table_id: str, at: datetime) -> None:
    """This process took the table: it has until the alert's margin to end a round."""
    round_ended(table_id, at)


def table_closed(table_id: str) -> None:
    """The table is closed: no rounds are expected any more, so its series go (no stalled alert)."""
    for gauge in (LAST_ROUND_ENDED, ROUND_WAIT):
        with contextlib.suppress(KeyError):
            gauge.remove(table_id)


def round_opened(table: Mapping[str, Any], variant: Variant[Any]) -> None:
    """The table's configured waits, from its row (limits and configuration)."""
    limits = ev.TableLimits.FromString(table["limits"])
    bidding = getattr(variant.parse_config(table["config"]), "bidding_seconds", 0)
    wait = bidding + limits.betting_seconds + limits.pause_between_rounds_ms / 1000
    ROUND_WAIT.labels(table["table_id"]).set(wait)
