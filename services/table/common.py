"""What the table's modules share: ids and names, the round's phases, bet receipts, round metrics,
and the settlement event (the wallet's contract)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from niuniu.table.v1 import events_pb2 as ev
from prometheus_client import Counter, Histogram

from backbone.auth import Principal
from bull.money import Settlement

COMMAND_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_STAKE_MINOR = 10**13

ROUNDS = Counter("niuniu_table_rounds_total", "Rounds ended, by variant and outcome.", ["variant", "outcome"])
SETTLEMENT_SECONDS = Histogram(
    "niuniu_table_settlement_seconds",
    "From the last reveal to the settlement event committed.",
    ["variant"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)


class Phase:
    BIDDING = "bidding"  # red-envelope bull: the dealer seat is bid for before betting
    BETTING = "betting"
    DEALING = "dealing"
    REVEALING = "revealing"
    SETTLING = "settling"
    SETTLED = "settled"
    VOIDED = "voided"
    ENDED = (SETTLED, VOIDED)


@dataclass(frozen=True, slots=True)
class BetReceipt:
    bet_id: str
    round_id: str
    area: str
    stake_minor: int
    hold_minor: int
    status: str
    replayed: bool


def unix_ms(moment: datetime | None) -> int:
    return int(moment.timestamp() * 1000) if moment else 0


def player_account(who: Principal) -> str:
    """The wallet account a player bets from (the same name the ledger journals)."""
    return f"player:{who.subject}"


def table_stream(table_id: str) -> str:
    return f"table-{table_id}"


def bet_stream(table_id: str, bet_id: str) -> str:
    return f"table-{table_id}.bet-{bet_id}"


def settlement_event(
    table_id: str,
    round_id: str,
    variant: str,
    settlement: Settlement,
    bets: Sequence[Mapping[str, Any]],
    area_odds: Mapping[str, str] | None = None,
) -> ev.RoundSettled:
    """The wallet's contract: every transfer, the hold it is paid from, and every hold of the round."""
    holds = {b["bet_id"]: b["hold_id"] for b in bets}
    players = {b["bet_id"]: b["player"] for b in bets}
    transfers = [
        ev.SettlementTransfer(
            payer=t.payer,
            payee=t.payee,
            amount_minor=t.amount_minor,
            kind=str(t.kind),
            bet_id=t.bet_id or "",
            hold_id=holds[t.bet_id] if t.bet_id and players.get(t.bet_id) == t.payer else "",
        )
        for t in settlement.transfers
    ]
    outcomes = [
        ev.BetOutcome(
            bet_id=r.bet_id,
            player=r.player,
            area=r.area,
            stake_minor=r.stake_minor,
            outcome=str(r.outcome),
            net_minor=r.net_minor,
            hold_id=holds[r.bet_id],
            odds=(area_odds or {}).get(r.area, ""),
        )
        for r in settlement.bets
    ]
    return ev.RoundSettled(
        table_id=table_id,
        round_id=round_id,
        variant=variant,
        bets=outcomes,
        transfers=transfers,
        hold_ids=[b["hold_id"] for b in bets],
    )
