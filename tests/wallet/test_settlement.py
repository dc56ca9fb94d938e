"""Round settlement from the table's topic: atomic, exactly once by event id AND by round id, rejections recorded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import psycopg
import pytest
from kafka import TopicPartition
from niuniu.table.v1 import events_pb2 as table_pb
from niuniu.wallet.v1 import events_pb2 as wallet_events
from niuniu.wallet.v1 import wallet_pb2 as pb
from prometheus_client import REGISTRY
from psycopg_pool import AsyncConnectionPool
from wallet_helpers import ADMIN, TABLE, Wallet, envelope, expect_error, settled, transfer, wallet_service

from backbone.db import create_schema, open_pool
from backbone.eventstore import EventStore, NewEvent
from backbone.kafka import make_consumer, make_producer
from backbone.relay import OutboxRelay
from services.wallet import events
from services.wallet.settlement import ROUND_SETTLED, ROUND_VOIDED

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0


@pytest.fixture
async def wallet(infra: dict[str, str], unique: str) -> AsyncIterator[Wallet]:
    async with wallet_service(infra, unique) as w:
        yield w


class FakeTable:
    """The table's side of the contract: its own event store, outbox and relay on the prefixed table topic."""

    def __init__(self, pool: AsyncConnectionPool, store: EventStore, relay: OutboxRelay) -> None:
        self.pool, self.store, self.relay = pool, store, relay

    async def emit(self, items: list[tuple[str, table_pb.RoundSettled | table_pb.RoundVoided]]) -> None:
        async with self.pool.connection() as conn, conn.transaction():
            for event_type, payload in items:
                version = await self.store.stream_version(conn, "table-1")
                event = NewEvent(event_type, payload, correlation_id=payload.round_id)
                await self.store.append(conn, "table-1", version, [event])
        while await self.relay.publish_once():
            pass


@pytest.fixture
async def table(wallet: Wallet, infra: dict[str, str], unique: str) -> AsyncIterator[FakeTable]:
    schema = f"tb_{unique}"
    async with await psycopg.AsyncConnection.connect(infra["DATABASE_URL"], autocommit=True) as conn:
        await create_schema(conn, schema)
    pool = await open_pool(infra["DATABASE_URL"], schema=schema, max_size=4)
    store = EventStore("table", wallet.topics.table_events)
    async with pool.connection() as conn:
        await store.setup(conn)
    relay = OutboxRelay("table", pool, make_producer(infra["KAFKA_BOOTSTRAP_SERVERS"], "fake-table"))
    yield FakeTable(pool, store, relay)
    await pool.close()
    async with await psycopg.AsyncConnection.connect(infra["DATABASE_URL"], autocommit=True) as conn:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def wait_until_consumed(wallet: Wallet, kafka_servers: str) -> None:
    """Until the wallet's consumer has stored a position at the end of every partition of the table topic."""
    topic = wallet.topics.table_events
    probe = make_consumer(kafka_servers, None, "probe")
    try:
        parts = [TopicPartition(topic, p) for p in probe.partitions_for_topic(topic)]
        ends = {tp.partition: offset for tp, offset in probe.end_offsets(parts).items() if offset}
    finally:
        probe.close()
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        rows = await wallet.sql("SELECT partition, next_offset FROM consumer_positions WHERE topic = %s", topic)
        if all(dict(rows).get(p, 0) >= end for p, end in ends.items()):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the consumer did not reach {ends}")


async def round_status(wallet: Wallet, round_id: str) -> pb.RoundSettlement:
    return await wallet.stub.GetRoundSettlement(pb.GetRoundSettlementRequest(round_id=round_id), metadata=ADMIN)


async def test_settlements_through_kafka_apply_once_however_often_they_arrive(
    wallet: Wallet, table: FakeTable, kafka_servers: str
) -> None:
    a, b, banker = await wallet.player(10_000), await wallet.player(10_000), await wallet.player(50_000)
    rounds: list[tuple[str, table_pb.RoundSettled | table_pb.RoundVoided]] = []
    for n in range(4):
        round_id = f"round-{n}"
        ha = await wallet.hold(a.account, 500, round_id)
        hb = await wallet.hold(b.account, 300, round_id)
        hk = await wallet.hold(banker.account, 2_000, round_id)
        transfers = [
            transfer(a.account, banker.account, 400, "loss", ha.hold_id),  # a loses 400 of a 500 hold
            transfer(a.account, "commission_revenue", 20, "commission", ha.hold_id),
            transfer(banker.account, b.account, 600, "win", hk.hold_id),  # the banker pays b from its hold
            transfer("house", b.account, 7, "rebate"),  # the house pays from available
            transfer("jackpot_pool", a.account, 1, "jackpot_payout"),  # a system account may go negative
        ]
        rounds.append((ROUND_SETTLED, settled(round_id, transfers, [ha.hold_id, hb.hold_id, hk.hold_id])))
    hv = await wallet.hold(a.account, 250, "round-void")
    rounds.append(
        (
            ROUND_VOIDED,
            table_pb.RoundVoided(
                table_id="table-1", round_id="round-void", reason="dealer 0.01", hold_ids=[hv.hold_id]
            ),
        )
    )

    await table.emit(rounds)
    await wait_until_consumed(wallet, kafka_servers)
    for _, payload in rounds:
        assert (await round_status(wallet, payload.round_id)).status in ("settled", "voided")
    first = await wallet.balances()
    assert first[a.account] == (10_000 - 4 * 420 + 4, 0)
    assert first[b.account] == (10_000 + 4 * 607, 0)
    assert first[banker.account] == (50_000 + 4 * 400 - 4 * 600, 0)
    assert first["commission_revenue"] == (80, 0)
    assert first["jackpot_pool"] == (-4, 0)
    assert sum(av + held for av, held in first.values()) == 0
    applied_before = await wallet.count_events(events.ROUND_SETTLEMENT_APPLIED)
    assert applied_before == 5

    # 1. The same records again on the topic (a relay that died before marking them published).
    async with table.pool.connection() as conn:
        stored = await table.store.read_all(conn)
    producer = make_producer(kafka_servers, "replayer")
    for event in stored:
        producer.send(
            wallet.topics.table_events, key=event.stream_id.encode(), value=event.envelope.SerializeToString()
        )
    producer.flush()
    producer.close()
    # 2. The table emitting every settlement again (new event ids, same rounds).
    await table.emit(rounds)
    await wait_until_consumed(wallet, kafka_servers)
    # 3. And the handler fed directly, as a redelivery after a crash would.
    for event in stored:
        await wallet.feed(event.envelope)

    assert await wallet.balances() == first
    assert await wallet.count_events(events.ROUND_SETTLEMENT_APPLIED) == applied_before
    assert await wallet.count_events(events.ROUND_SETTLEMENT_REJECTED) == 0
    processed = await wallet.sql("SELECT count(*) FROM processed_events")
    assert processed == [(10,)]  # each distinct event id once; the raw duplicates were recognised

    async with wallet.ctx.pool.connection() as conn:
        applied = [
            e
            for e in await wallet.ctx.store.read_correlated(conn, "round-0")
            if e.event_type == events.ROUND_SETTLEMENT_APPLIED
        ]
    assert len(applied) == 1
    outcome = wallet_events.RoundSettlementApplied()
    applied[0].unpack(outcome)
    assert outcome.outcome == "settled" and sorted(outcome.holds_posted) != []
    assert len(outcome.holds_voided) == 1  # b's hold: nothing taken from it
    for movement in outcome.movements:
        assert sum(leg.amount_minor for leg in movement.legs) == 0


def rejected_total(reason: str) -> float:
    return REGISTRY.get_sample_value("niuniu_wallet_settlements_rejected_total", {"reason": reason}) or 0.0


async def test_an_invalid_settlement_changes_nothing_and_is_recorded_as_rejected(wallet: Wallet) -> None:
    a, b = await wallet.player(1_000), await wallet.player(1_000)
    ha = await wallet.hold(a.account, 300, "r-bad")
    hb = await wallet.hold(b.account, 300, "r-bad")
    before = await wallet.balances()
    cases = [
        (
            "HOLD_INSUFFICIENT",
            [
                transfer(a.account, "house", 200, hold_id=ha.hold_id),
                transfer(a.account, "house", 200, hold_id=ha.hold_id),
            ],
        ),
        (
            "HOLD_NOT_FOUND",
            [
                transfer(a.account, "house", 100, hold_id=ha.hold_id),
                transfer(b.account, "house", 100, hold_id="no-such-hold"),
            ],
        ),
        ("HOLD_WRONG_ACCOUNT", [transfer(a.account, "house", 100, hold_id=hb.hold_id)]),
        ("PAYER_NOT_SYSTEM", [transfer(a.account, "house", 100)]),
        ("ACCOUNT_NOT_FOUND", [transfer("house", "player:00000000-0000-4000-8000-000000000000", 5)]),
        ("AMOUNT_INVALID", [transfer("house", a.account, 0)]),
    ]
    for reason, transfers in cases:
        seen = rejected_total(reason)
        await wallet.settle_direct(ROUND_SETTLED, settled("r-bad", transfers, [ha.hold_id, hb.hold_id]), "r-bad")
        status = await round_status(wallet, "r-bad")
        assert (status.status, status.reason) == ("rejected", reason)
        assert rejected_total(reason) == seen + 1
        assert await wallet.balances() == before
    assert (await wallet.stub.GetHold(pb.GetHoldRequest(hold_id=ha.hold_id), metadata=TABLE)).status == (
        pb.HOLD_STATUS_OPEN
    )
    assert await wallet.count_events(events.ROUND_SETTLEMENT_REJECTED) == len(cases)

    # An unreadable payload is rejected too, under the envelope's round.
    await wallet.feed(envelope(ROUND_SETTLED, table_pb.RoundVoided(round_id="r-bad"), "r-bad"))
    assert (await round_status(wallet, "r-bad")).reason == "PAYLOAD_INVALID"

    # A corrected settlement of the same round then applies.
    good = settled("r-bad", [transfer(a.account, "house", 120, hold_id=ha.hold_id)], [ha.hold_id, hb.hold_id])
    await wallet.settle_direct(ROUND_SETTLED, good, "r-bad")
    assert (await round_status(wallet, "r-bad")).status == "settled"
    assert await wallet.balance(a.account) == (880, 0)
    assert await wallet.balance(b.account) == (1_000, 0)

    # A different settlement of an applied round is refused; the round stays settled.
    await wallet.settle_direct(ROUND_VOIDED, table_pb.RoundVoided(round_id="r-bad", hold_ids=[ha.hold_id]), "r-bad")
    status = await round_status(wallet, "r-bad")
    assert (status.status, status.reason) == ("settled", "ROUND_ALREADY_SETTLED")
    assert await wallet.balance(a.account) == (880, 0)


async def test_a_round_whose_settlement_was_rejected_is_repaired_by_its_void_which_releases_every_hold(
    wallet: Wallet,
) -> None:
    """The operator's repair (``services/table/repair.py``): the table voids a round the wallet refused."""
    a, b = await wallet.player(1_000), await wallet.player(1_000)
    ha, hb = await wallet.hold(a.account, 300, "r-fix"), await wallet.hold(b.account, 300, "r-fix")
    split = settled("r-fix", [transfer(a.account, "house", 400, hold_id=ha.hold_id)], [ha.hold_id, hb.hold_id])
    await wallet.settle_direct(ROUND_SETTLED, split, "r-fix")
    assert (await round_status(wallet, "r-fix")).reason == "HOLD_INSUFFICIENT"
    assert await wallet.balance(a.account) == (700, 300)  # frozen: nothing of the round applied
    # The alert's latch: the round counts as rejected, whatever the counters did, until it is repaired.
    assert await rounds_rejected(wallet) == 1
    void = table_pb.RoundVoided(round_id="r-fix", reason="REPAIRED", hold_ids=[ha.hold_id, hb.hold_id])
    rejected = sum(rejected_total(r) for r in ("ROUND_ALREADY_VOIDED", "ROUND_ALREADY_SETTLED"))
    await wallet.settle_direct(ROUND_VOIDED, void, "r-fix")
    assert (await round_status(wallet, "r-fix")).status == "voided"
    assert await rounds_rejected(wallet) == 0
    for player, hold in ((a, ha), (b, hb)):
        assert await wallet.balance(player.account) == (1_000, 0)
        got = await wallet.stub.GetHold(pb.GetHoldRequest(hold_id=hold.hold_id), metadata=TABLE)
        assert got.status == pb.HOLD_STATUS_VOIDED
    # The void again is a duplicate; the refused settlement again is refused and moves nothing.
    await wallet.settle_direct(ROUND_VOIDED, void, "r-fix")
    assert sum(rejected_total(r) for r in ("ROUND_ALREADY_VOIDED", "ROUND_ALREADY_SETTLED")) == rejected
    await wallet.settle_direct(ROUND_SETTLED, split, "r-fix")
    status = await round_status(wallet, "r-fix")
    assert (status.status, status.reason) == ("voided", "ROUND_ALREADY_VOIDED")
    assert await wallet.balance(a.account) == (1_000, 0)
    await wallet.ledger_agrees()


async def rounds_rejected(wallet: Wallet) -> float | None:
    await wallet.app.refresh_hold_gauges()
    return REGISTRY.get_sample_value("niuniu_wallet_rounds_rejected")


async def test_a_hold_from_another_round_is_refused(wallet: Wallet) -> None:
    a = await wallet.player(1_000)
    other = await wallet.hold(a.account, 300, "r-other")
    await wallet.settle_direct(
        ROUND_SETTLED, settled("r-this", [transfer(a.account, "house", 50, hold_id=other.hold_id)], []), "r-this"
    )
    assert (await round_status(wallet, "r-this")).reason == "HOLD_ROUND_MISMATCH"
    await wallet.settle_direct(
        ROUND_VOIDED, table_pb.RoundVoided(round_id="r-this", hold_ids=[other.hold_id]), "r-this"
    )
    assert (await round_status(wallet, "r-this")).reason == "HOLD_ROUND_MISMATCH"
    assert await wallet.balance(a.account) == (700, 300)


async def test_a_hold_of_the_round_its_settlement_does_not_name_is_released(wallet: Wallet) -> None:
    # A bet's hold the wallet placed while the table, timed out, never recorded the bet: no
    # settlement names it. Once the round's settlement is applied nothing can post it, so the
    # settlement's transaction releases it (as VoidHold would) instead of leaving it to its expiry.
    a, b = await wallet.player(1_000), await wallet.player(1_000)
    named = await wallet.hold(a.account, 300, "r-stray")
    stray = await wallet.hold(b.account, 200, "r-stray")
    elsewhere = await wallet.hold(b.account, 100, "r-later")
    settlement = settled("r-stray", [transfer(a.account, "house", 300, hold_id=named.hold_id)], [named.hold_id])
    await wallet.settle_direct(ROUND_SETTLED, settlement, "r-stray")
    assert (await round_status(wallet, "r-stray")).status == "settled"
    assert await wallet.balance(a.account) == (700, 0)
    assert await wallet.balance(b.account) == (900, 100)  # the stray released, the other round's kept
    hold = await wallet.stub.GetHold(pb.GetHoldRequest(hold_id=stray.hold_id), metadata=TABLE)
    assert hold.status == pb.HOLD_STATUS_VOIDED
    assert (await wallet.stub.GetHold(pb.GetHoldRequest(hold_id=elsewhere.hold_id), metadata=TABLE)).status == (
        pb.HOLD_STATUS_OPEN
    )
    # The table's own late VoidHold is a replay; the settlement arriving again changes nothing.
    await wallet.stub.VoidHold(pb.VoidHoldRequest(hold_id=stray.hold_id), metadata=TABLE)
    await wallet.settle_direct(ROUND_SETTLED, settlement, "r-stray")
    assert await wallet.balance(b.account) == (900, 100)
    # A hold for the settled round arriving late (a delayed PlaceHold) is refused, not left open.
    await expect_error(wallet.hold(b.account, 50, "r-stray"), grpc.StatusCode.FAILED_PRECONDITION, "ROUND_ENDED")
    assert await wallet.balance(b.account) == (900, 100)
    await wallet.ledger_agrees()


async def red_envelope_table(wallet: Wallet, round_id: str) -> tuple[str, str, str, str, list[str]]:
    """A dealer (2 000, of which the pool of 1 000 held), two losers and a winner, each bet held."""
    dealer, loser_1, loser_2, winner = [await wallet.player(n) for n in (2_000, 1_000, 1_000, 1_000)]
    holds = [
        (await wallet.hold(dealer.account, 1_000, round_id)).hold_id,
        (await wallet.hold(loser_1.account, 300, round_id)).hold_id,
        (await wallet.hold(loser_2.account, 300, round_id)).hold_id,
        (await wallet.hold(winner.account, 500, round_id)).hold_id,
    ]
    return dealer.account, loser_1.account, loser_2.account, winner.account, holds


async def test_a_dealer_pays_winners_past_its_pool_from_what_the_losers_paid_it(wallet: Wallet) -> None:
    dealer, loser_1, loser_2, winner, holds = await red_envelope_table(wallet, "r-env")
    pool, hold_1, hold_2, _ = holds
    settlement = settled(
        "r-env",
        [
            transfer(loser_1, dealer, 300, "loss", hold_1),
            transfer(loser_2, dealer, 200, "loss", hold_2),
            transfer(dealer, winner, 1_000, "win", pool),  # the whole pool
            transfer(dealer, winner, 400, "win"),  # past the pool: from the 500 the losers paid
            transfer(dealer, "fees", 60, "dealer_fee"),
            transfer(dealer, "fees", 40, "service_fee"),  # exactly what was left of the 500
        ],
        holds,
    )
    await wallet.settle_direct(ROUND_SETTLED, settlement, "r-env")
    status = await round_status(wallet, "r-env")
    assert (status.status, status.reason) == ("settled", "")
    after = await wallet.balances()
    assert after[dealer] == (1_000, 0)  # its own free 1 000 untouched; the pool and the losses paid out
    assert after[loser_1] == (700, 0) and after[loser_2] == (800, 0)
    assert after[winner] == (2_400, 0)
    assert after["fees"] == (100, 0)
    assert sum(av + held for av, held in after.values()) == 0

    # Each hold-less payment is one plain transfer from the dealer's available balance.
    async with wallet.ctx.pool.connection() as conn:
        (applied,) = [
            e
            for e in await wallet.ctx.store.read_correlated(conn, "r-env")
            if e.event_type == events.ROUND_SETTLEMENT_APPLIED
        ]
    payload = wallet_events.RoundSettlementApplied()
    applied.unpack(payload)
    hold_less = [m for m in payload.movements if m.kind in ("win", "dealer_fee", "service_fee") and not m.hold_id]
    assert [[(leg.account, leg.bucket, leg.amount_minor) for leg in m.legs] for m in hold_less] == [
        [(dealer, wallet_events.BUCKET_AVAILABLE, -400), (winner, wallet_events.BUCKET_AVAILABLE, 400)],
        [(dealer, wallet_events.BUCKET_AVAILABLE, -60), ("fees", wallet_events.BUCKET_AVAILABLE, 60)],
        [(dealer, wallet_events.BUCKET_AVAILABLE, -40), ("fees", wallet_events.BUCKET_AVAILABLE, 40)],
    ]
    await wallet.ledger_agrees()
    assert await wallet.verify_round(settlement) == []  # the fee kinds are settlement transfers to the ledger


async def test_a_player_never_pays_from_its_own_free_balance(wallet: Wallet) -> None:
    dealer, loser_1, _, winner, holds = await red_envelope_table(wallet, "r-env")
    pool, hold_1, _, _ = holds
    before = await wallet.balances()
    cases = [
        # No earlier credit: the dealer's free 1 000 is not the settlement's to spend.
        [transfer(dealer, winner, 1_000, "win", pool), transfer(dealer, winner, 1, "win")],
        # A credit that comes later does not count.
        [
            transfer(dealer, winner, 1_000, "win", pool),
            transfer(dealer, winner, 300, "win"),
            transfer(loser_1, dealer, 300, "loss", hold_1),
        ],
        # Hold-less payments beyond the credits.
        [
            transfer(loser_1, dealer, 300, "loss", hold_1),
            transfer(dealer, winner, 250, "win"),
            transfer(dealer, "fees", 51, "dealer_fee"),
        ],
        # Another player's credit is not the dealer's.
        [transfer(loser_1, winner, 300, "loss", hold_1), transfer(dealer, winner, 100, "win")],
    ]
    for transfers in cases:
        await wallet.settle_direct(ROUND_SETTLED, settled("r-env", transfers, holds), "r-env")
        status = await round_status(wallet, "r-env")
        assert (status.status, status.reason) == ("rejected", "PAYER_NOT_SYSTEM")
        assert "must pay from a hold or from what this settlement paid it before" in status.detail
        assert await wallet.balances() == before
    for hold_id in holds:
        assert (await wallet.stub.GetHold(pb.GetHoldRequest(hold_id=hold_id), metadata=TABLE)).status == (
            pb.HOLD_STATUS_OPEN
        )
    assert await wallet.count_events(events.ROUND_SETTLEMENT_APPLIED) == 0
