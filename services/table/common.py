"""What the table's modules share: ids and names, the round's phases, limits, bet receipts, metrics,
and the settlement event (the wallet's contract)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from niuniu.table.v1 import events_pb2 as ev
from prometheus_client import Counter, Histogram

from backbone.auth import Principal
from backbone.errors import InvalidArgument
from bull import fairness as fair
from bull import variants
from bull.variants import Variant
from services.table.core.settlement import settlement_event as settlement_event
from services.table.core.state import Phase as Phase
from services.table.core.view import counted

HOLD_GRACE = timedelta(hours=48)
"""How long a round's holds outlive its betting window before the wallet's sweeper may release
them. The table settles or voids its own rounds (a replica takes over a lost table, CloseTable
ends one), so the wallet's expiry is only the net for a table that is gone for good. It must
outlast any step of the wall clock a round can live through (a VM resumed, an NTP step): a hold
expired under a round in play makes the wallet refuse that round's settlement."""

COMMAND_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # matched whole (fullmatch), like every id
TABLE_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
MAX_STAKE_MINOR = 10**13


def scoped_id(player: str, command_id: str) -> str:
    """The id a player's command (a bet, a bid, a change) is stored under: command ids are per player, so
    one player's id never answers, nor blocks, another's command. Deterministic, so a retry finds its first
    result; 32 hex characters, so ``bet.<id>`` stays a wallet hold id."""
    return hashlib.sha256(f"{player}\n{command_id}".encode()).hexdigest()[:32]


ROUNDS = Counter("niuniu_table_rounds_total", "Rounds ended, by variant and outcome.", ["variant", "outcome"])
SETTLEMENT_SECONDS = Histogram(
    "niuniu_table_settlement_seconds",
    "From the last reveal to the settlement event committed.",
    ["variant"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
BETS = Counter("niuniu_table_bets_total", "Bets accepted, by variant and area.", ["variant", "area"])
BET_STAKES = Counter("niuniu_table_bet_stake_minor_total", "Minor units staked, by variant.", ["variant"])
BETS_REFUSED = Counter("niuniu_table_bets_refused_total", "Bets refused, by reason.", ["reason"])
CALLED_BETS_REFUSED = Counter(
    "niuniu_table_called_bets_refused_total",
    "Bets of PlaceBets calls refused, by reason (every reason): each is an outcome of an OK call, not a"
    " gRPC status code.",
    ["reason"],
)
BET_GROUP_SIZE = Histogram(
    "niuniu_table_bet_group_size",
    "Bets recorded together in one transaction (group commit).",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
BIDS = Counter("niuniu_table_bids_total", "Red-envelope dealer bids, by outcome (placed, or the refusal).", ["outcome"])
REDEALS = Counter("niuniu_table_redeals_total", "Red-envelope rounds voided and re-dealt, by cause.", ["cause"])
for _outcome in ("placed", "BID_TOO_LOW", "BIDDING_CLOSED"):
    BIDS.labels(_outcome)
for _cause in ("DEALER_GRABBED_0.01", "ENVELOPE_ERROR"):
    REDEALS.labels(_cause)

DEFAULT_LIMITS = ev.TableLimits(
    min_bet_minor=100,
    max_bet_minor=1_000_000,
    chips_minor=[100, 500, 1_000, 5_000, 10_000, 50_000],
    betting_seconds=15,
    reveal_interval_ms=1_000,
    pause_between_rounds_ms=3_000,
)


@dataclass(frozen=True, slots=True)
class BetReceipt:
    bet_id: str
    round_id: str
    area: str
    stake_minor: int
    hold_minor: int
    status: str
    replayed: bool
    hold_id: str
    client_seed: str

    @classmethod
    def of(cls, bet: Mapping[str, object], *, replayed: bool) -> BetReceipt:
        return cls(
            str(bet["bet_id"]),
            str(bet["round_id"]),
            str(bet["area"]),
            int(bet["stake_minor"]),  # type: ignore[call-overload]
            int(bet["hold_minor"]),  # type: ignore[call-overload]
            str(bet["status"]),
            replayed,
            str(bet["hold_id"]),
            str(bet["client_seed"]),
        )


def unix_ms(moment: datetime | None) -> int:
    return int(moment.timestamp() * 1000) if moment else 0


def player_account(who: Principal) -> str:
    """The wallet account a player bets from (the same name the ledger journals)."""
    return f"player:{who.subject}"


def table_stream(table_id: str) -> str:
    return f"table-{table_id}"


def bet_stream(table_id: str, bet_id: str) -> str:
    return f"table-{table_id}.bet-{bet_id}"


def banker_stream(table_id: str) -> str:
    return f"table-{table_id}.banker"


def variant_of(name: str) -> Variant[Any]:
    try:
        return variants.get(name)
    except variants.UnknownVariant as error:
        raise InvalidArgument("VARIANT_UNKNOWN", str(error)) from None


def parse_config(variant: Variant[Any], config: Mapping[str, str]) -> dict[str, str]:
    """The full configuration (defaults filled in) as text; INVALID_ARGUMENT naming a bad key."""
    try:
        return variant.config_settings(variant.parse_config(config))
    except variants.ConfigError as error:
        raise InvalidArgument("CONFIG_INVALID", str(error)) from None


def check_limits(variant: Variant[Any], limits: ev.TableLimits) -> ev.TableLimits:
    """The table's limits over the defaults (the variant's own betting window first); INVALID_ARGUMENT if unusable."""
    merged = ev.TableLimits()
    merged.CopyFrom(DEFAULT_LIMITS)
    if variant.default_betting_seconds is not None:
        merged.betting_seconds = variant.default_betting_seconds
    for field, value in limits.ListFields():
        if field.name == "chips_minor":
            del merged.chips_minor[:]
            merged.chips_minor.extend(value)
        else:
            setattr(merged, field.name, value)
    if not 0 < merged.min_bet_minor <= merged.max_bet_minor <= MAX_STAKE_MINOR:
        raise InvalidArgument("LIMITS_INVALID", "need 0 < min_bet_minor <= max_bet_minor <= 10^13")
    if not merged.chips_minor or min(merged.chips_minor) <= 0:
        raise InvalidArgument("LIMITS_INVALID", "chips_minor must list positive chip values")
    if not 1 <= merged.betting_seconds <= 600:
        raise InvalidArgument("LIMITS_INVALID", "betting_seconds must be 1..600")
    if not 0 <= merged.reveal_interval_ms <= 60_000 or not 0 <= merged.pause_between_rounds_ms <= 600_000:
        raise InvalidArgument("LIMITS_INVALID", "reveal_interval_ms must be 0..60000 and the pause 0..600000")
    return merged


def check_client_seed(client_seed: str) -> str:
    """A bet's client seed contribution ('' for none), or INVALID_ARGUMENT CLIENT_SEED_MALFORMED."""
    if client_seed:
        try:
            fair.check_client_seed_contribution(client_seed)
        except fair.ClientSeedError as error:
            raise InvalidArgument("CLIENT_SEED_MALFORMED", str(error)) from None
    return client_seed


def contribution_counted(bet: Mapping[str, object], round_client_seed: str) -> bool:
    """Whether a bet's client seed contribution entered its round's client seed (``core.view.counted``)."""
    return counted(str(bet["client_seed"] or ""), str(bet["status"]), round_client_seed)


def counted_contributions(bets: Sequence[Mapping[str, object]], round_client_seed: str) -> list[str]:
    """The contributions the round's client seed combines, sorted by their bytes (docs/fairness.md, section 10)."""
    counted = [str(b["client_seed"]) for b in bets if contribution_counted(b, round_client_seed)]
    return sorted(counted, key=lambda c: c.encode())
