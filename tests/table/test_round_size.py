"""The largest round the table takes fits in one Kafka record, in every variant.

A round's settlement travels as two events that grow with its bets: the table's RoundSettled
and the wallet's RoundSettlementApplied. Neither may be larger than the event store accepts
(``MAX_PAYLOAD_BYTES``, under the bus's record limit), or the round could never settle. Each
variant's round of ``MAX_BETS_PER_ROUND`` bets, with identifiers as long as the system makes
them, is settled by the rules, turned into the table's event by the table's own code and into
the wallet's by the wallet's own decision: both fit, with the room to spare printed.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from niuniu.v1 import events_pb2

from backbone.eventstore import MAX_PAYLOAD_BYTES, EventTooLarge, NewEvent, build_envelope
from backbone.kafka import MAX_RECORD_BYTES
from bull.variants import VARIANTS, Funding, RoundShape, TableBet
from services.table.bets import MAX_BETS_PER_ROUND
from services.table.common import scoped_id, settlement_event
from services.wallet import events as wallet_events
from services.wallet.domain import AccountState, account_kind
from services.wallet.domain_holds import Hold, HoldRequest
from services.wallet.domain_settlement import decide_settlement
from services.wallet.settlement import command_from
from tests.table.test_variants import deal_input

NOW = datetime(2026, 12, 4, 12, tzinfo=UTC)
TABLE_ID = "t" * 64  # the longest table id CreateTable takes
ROUND_ID = f"{TABLE_ID}-r1234567"
DEALER = f"player:{uuid.UUID(int=1)}"
DEALER_HOLD = "dealer.hold"
SEEDS = (1, 2, 3)


def envelope_of(event: NewEvent) -> events_pb2.EventEnvelope:
    return build_envelope(
        event_id=str(uuid.UUID(int=7)),
        stream_id=f"round-{ROUND_ID}",
        version=1,
        event=event,
        occurred_at=NOW,
        producer="table",
        store_position=0,
    )


def largest_round(variant_id: str, seed: int) -> tuple[int, int] | None:
    """(the table's RoundSettled payload bytes, the wallet's RoundSettlementApplied payload bytes) of a round
    of MAX_BETS_PER_ROUND bets, each of a player of its own on the variant's areas in turn; None when the
    deal voids the round (a red-envelope dealer's 0.01)."""
    variant = VARIANTS[variant_id]
    config = variant.parse_config({})
    pick = random.Random(seed)
    bets = []
    for i in range(MAX_BETS_PER_ROUND):
        player = f"player:{uuid.UUID(int=pick.getrandbits(128), version=4)}"
        area = variant.areas[i % len(variant.areas)]
        bet_id = scoped_id(player, f"command-{i}")
        bets.append(
            TableBet(
                bet_id, player, area, variant.fixed_stake_minor(area, config) or 100 * (1 + i % 50), f"bet.{bet_id}"
            )
        )
    pool = 10**9
    dealer = "" if variant.shape is RoundShape.HOUSE_DEALER else DEALER
    hold = 10**13 if variant.shape is RoundShape.BANKER_SEAT else config.bid_hold_minor(pool) if dealer else 0
    funding = Funding(dealer, DEALER_HOLD if dealer else "", hold, pool, jackpot_pool_minor=pool)
    hands = variant.deal(deal_input(variant_id, seed, [b.bet_id for b in bets]), config)  # type: ignore[arg-type]
    if variant.void_reason(hands, config):
        return None
    settlement = variant.settle(hands, bets, config, funding)
    odds = variant.area_odds(hands, config)
    settled = settlement_event(
        TABLE_ID,
        ROUND_ID,
        variant_id,
        settlement,
        [b.hold_id for b in bets] + ([DEALER_HOLD] if dealer else []),
        {b.bet_id: b.hold_id for b in bets},
        odds,
        pool,
    )
    settled.area_outcomes.update(variant.area_outcomes(hands, config))
    settled.area_odds.update(odds)
    table_envelope = envelope_of(NewEvent("table.round_settled", settled, ROUND_ID))

    command = command_from(table_envelope)  # the wallet reads the event as it travels
    named = command.accounts() | {b.player for b in bets} | ({dealer} if dealer else set())
    accounts = {a: AccountState(a, account_kind(a), 10**15, 10**15) for a in named}
    holds = {
        b.hold_id: Hold(
            HoldRequest(b.hold_id, b.player, variant.hold_minor(b.stake_minor, config), "bet", ROUND_ID, 0),
            NOW + timedelta(minutes=5),
            NOW,
        )
        for b in bets
    }
    if dealer:
        holds[DEALER_HOLD] = Hold(
            HoldRequest(DEALER_HOLD, dealer, hold, "banker", ROUND_ID, 0), NOW + timedelta(minutes=5), NOW
        )
    plan = decide_settlement(command, accounts, holds, NOW)
    applied = wallet_events.settlement_applied(ROUND_ID, TABLE_ID, plan, False, str(uuid.UUID(int=7)))
    wallet_envelope = envelope_of(applied)
    return len(table_envelope.payload.value), len(wallet_envelope.payload.value)


@pytest.mark.parametrize("variant_id", sorted(VARIANTS))
def test_a_full_round_settles_in_events_the_bus_carries(variant_id: str) -> None:
    sizes = [s for s in (largest_round(variant_id, seed) for seed in SEEDS) if s is not None]
    assert sizes, "every deal voided the round"
    table_bytes = max(t for t, _ in sizes)
    wallet_bytes = max(w for _, w in sizes)
    print(
        f"{variant_id}: {MAX_BETS_PER_ROUND} bets -> RoundSettled {table_bytes} B, RoundSettlementApplied"
        f" {wallet_bytes} B ({100 * max(table_bytes, wallet_bytes) / MAX_PAYLOAD_BYTES:.0f} % of {MAX_PAYLOAD_BYTES})"
    )
    assert table_bytes > MAX_BETS_PER_ROUND * 100 and wallet_bytes > MAX_BETS_PER_ROUND * 100  # every bet is in them
    assert max(table_bytes, wallet_bytes) <= MAX_PAYLOAD_BYTES


def test_the_store_refuses_an_event_over_the_limit_before_anything_is_written() -> None:
    too_big = events_pb2.EventEnvelope(producer="x" * MAX_PAYLOAD_BYTES)  # any message: its bytes count
    with pytest.raises(EventTooLarge, match=f"over the {MAX_PAYLOAD_BYTES}"):
        envelope_of(NewEvent("test.too_big", too_big, "c"))
    at_limit = events_pb2.EventEnvelope(producer="x" * (MAX_PAYLOAD_BYTES - 5))  # a tag byte, four of length
    assert len(envelope_of(NewEvent("test.at_limit", at_limit, "c")).payload.value) == MAX_PAYLOAD_BYTES
    assert MAX_PAYLOAD_BYTES + 64 * 1024 == MAX_RECORD_BYTES  # room for the envelope's other fields and the key
