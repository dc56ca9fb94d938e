"""A Golden Bull round played by the rules from a known seed: the table's public view and the ledger's evidence."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2

from bull import fairness as fair
from bull.variants import VARIANTS, Funding, SeatHand, TableBet
from services.ledger.queries import RoundRecord
from services.ledger.verify import RoundEvidence

SEED = bytes(range(32))
ROUND = "t1-r7"


def played_round() -> tuple[table_pb2.RoundView, RoundEvidence]:
    variant = VARIANTS["golden_bull"]
    config = variant.parse_config({"commission_bps": "500"})
    deck = fair.shuffle(SEED, ROUND, "", 52)
    hands = variant.deal(deck, config)
    bets = [
        TableBet("b1", "player:a", "area_1", 1_000),
        TableBet("b2", "player:b", "area_2", 500),
        TableBet("b3", "player:a", "area_3", 300),
    ]
    settlement = variant.settle(hands, bets, config, Funding())
    settled = ev.RoundSettled(
        table_id="t1",
        round_id=ROUND,
        variant="golden_bull",
        bets=[
            ev.BetOutcome(bet_id=r.bet_id, player=r.player, area=r.area, stake_minor=r.stake_minor)
            for r in settlement.bets
        ],
        transfers=[
            ev.SettlementTransfer(
                payer=t.payer, payee=t.payee, amount_minor=t.amount_minor, kind=str(t.kind), bet_id=t.bet_id or ""
            )
            for t in settlement.transfers
        ],
    )
    view = revealed_view(ROUND, "golden_bull", config, hands)
    record = RoundRecord(ROUND, "settled", settled.SerializeToString(), (), ())
    return view, RoundEvidence.of(record)


def revealed_view(round_id: str, variant_id: str, config: Any, hands: Mapping[str, SeatHand]) -> table_pb2.RoundView:
    """The table's public view of a round of table t1 dealt from ``SEED``, every hand revealed whole."""
    return table_pb2.RoundView(
        table_id="t1",
        round_id=round_id,
        commitment=fair.commit(SEED),
        server_seed=SEED.hex(),
        variant=variant_id,
        config=VARIANTS[variant_id].config_settings(config),
        hands=[ev.HandRevealed(seat=seat, cards=[c.code for c in hand.cards]) for seat, hand in hands.items()],
    )
