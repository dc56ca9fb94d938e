"""ResizeHold on the real stack: up, down and same; refusals change nothing; idempotent by resize_id;
a resized hold settles at its new amount and the ledger journals it to the same balances."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import grpc
import pytest
from niuniu.wallet.v1 import events_pb2 as wallet_events
from niuniu.wallet.v1 import wallet_pb2 as pb
from prometheus_client import REGISTRY
from wallet_helpers import ADMIN, TABLE, Wallet, expect_error, settled, transfer, wallet_service

from services.wallet import events
from services.wallet.settlement import ROUND_SETTLED

pytestmark = pytest.mark.integration

FAILED = grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture
async def wallet(infra: dict[str, str], unique: str) -> AsyncIterator[Wallet]:
    async with wallet_service(infra, unique) as w:
        yield w


def resized_total(direction: str) -> float:
    return REGISTRY.get_sample_value("niuniu_wallet_holds_resized_total", {"direction": direction}) or 0.0


async def get_hold(wallet: Wallet, hold_id: str) -> pb.Hold:
    reply: pb.Hold = await wallet.stub.GetHold(pb.GetHoldRequest(hold_id=hold_id), metadata=TABLE)
    return reply


async def snapshot(wallet: Wallet, hold_id: str) -> tuple[Any, ...]:
    counts = await wallet.sql(
        "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM wallet_entries),"
        " (SELECT count(*) FROM wallet_hold_resizes)"
    )
    return await wallet.balances(), counts, await get_hold(wallet, hold_id)


async def test_a_hold_grows_shrinks_and_stays(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=1_000)
    placed = pb.PlaceHoldRequest(hold_id="bet-1", account=player.account, amount_minor=300, reason="bet", round_id="r1")
    await wallet.stub.PlaceHold(placed, metadata=TABLE)
    seen = {d: resized_total(d) for d in ("up", "down", "same")}

    up = await wallet.resize_hold("bet-1", 500, "rs-up")
    assert not up.replayed and up.hold.amount_minor == 500 and up.hold.status == pb.HOLD_STATUS_OPEN
    assert await wallet.balance(player.account) == (500, 500)
    down = await wallet.resize_hold("bet-1", 200, "rs-down")
    assert not down.replayed and down.hold.amount_minor == 200
    assert await wallet.balance(player.account) == (800, 200)
    same = await wallet.resize_hold("bet-1", 200, "rs-same")
    assert not same.replayed and same.hold == down.hold
    assert await wallet.balance(player.account) == (800, 200)
    assert {d: resized_total(d) - seen[d] for d in seen} == {"up": 1, "down": 1, "same": 1}

    # The hold shows what it holds now; PlaceHold's own repeat still answers (it names the placed amount).
    assert (await get_hold(wallet, "bet-1")).amount_minor == 200
    listed = await wallet.stub.ListHolds(pb.ListHoldsRequest(account=player.account), metadata=ADMIN)
    assert [h.amount_minor for h in listed.holds] == [200]
    again = await wallet.stub.PlaceHold(placed, metadata=TABLE)
    assert again.replayed and again.hold.amount_minor == 200

    # Each resize is recorded; the two that moved money are movements on the hold and its round.
    rows = await wallet.sql("SELECT resize_id, hold_id, previous_minor, amount_minor FROM wallet_hold_resizes")
    assert sorted(rows) == [
        ("rs-down", "bet-1", 500, 200),
        ("rs-same", "bet-1", 200, 200),
        ("rs-up", "bet-1", 300, 500),
    ]
    moves = await wallet.stub.ListMovements(pb.ListMovementsRequest(account=player.account), metadata=ADMIN)
    resizes = [
        (m.movement_id, m.available_delta_minor, m.held_delta_minor) for m in moves.movements if m.kind == "hold_resize"
    ]
    assert resizes == [("resize:rs-down", 300, -300), ("resize:rs-up", -200, 200)]
    assert all(m.hold_id == "bet-1" and m.round_id == "r1" for m in moves.movements if m.kind == "hold_resize")

    # Three HoldResized events; the one that changed nothing carries no movement.
    async with wallet.ctx.pool.connection() as conn:
        stored = [e for e in await wallet.ctx.store.read_correlated(conn, "r1") if e.event_type == events.HOLD_RESIZED]
    payloads = [wallet_events.HoldResized() for _ in stored]
    for event, payload in zip(stored, payloads, strict=True):
        event.unpack(payload)
    assert [(p.resize_id, p.previous_minor, p.amount_minor, p.HasField("movement")) for p in payloads] == [
        ("rs-up", 300, 500, True),
        ("rs-down", 500, 200, True),
        ("rs-same", 200, 200, False),
    ]
    assert all(p.movement.hold_id == "bet-1" and p.movement.round_id == "r1" for p in payloads[:2])
    await wallet.ledger_agrees()

    # Voiding releases what the hold holds now.
    voided = await wallet.stub.VoidHold(pb.VoidHoldRequest(hold_id="bet-1"), metadata=TABLE)
    assert (voided.hold.amount_minor, voided.hold.released_minor) == (200, 200)
    assert await wallet.balance(player.account) == (1_000, 0)
    await wallet.ledger_agrees()


async def test_a_larger_hold_needs_the_funds_and_a_refusal_changes_nothing(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=1_000)
    hold = await wallet.hold(player.account, 600, "r1")
    before = await snapshot(wallet, hold.hold_id)
    error = await expect_error(wallet.resize_hold(hold.hold_id, 1_001, "rs-1"), FAILED, "INSUFFICIENT_FUNDS")
    assert "400 available" in (error.details() or "")
    assert await snapshot(wallet, hold.hold_id) == before
    # Nothing was recorded: the same resize id may be used for what fits.
    assert (await wallet.resize_hold(hold.hold_id, 1_000, "rs-1")).hold.amount_minor == 1_000
    assert await wallet.balance(player.account) == (0, 1_000)


async def test_an_increase_meets_the_same_player_checks_as_a_hold(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=10_000)
    await wallet.stub.SetLimit(
        pb.SetLimitRequest(account=player.account, kind=pb.LIMIT_KIND_DAILY_LOSS, value=500), metadata=ADMIN
    )
    hold = await wallet.hold(player.account, 400, "r1")
    await expect_error(wallet.resize_hold(hold.hold_id, 501), FAILED, "LOSS_LIMIT_REACHED")
    assert (await wallet.resize_hold(hold.hold_id, 500)).hold.amount_minor == 500  # at the limit
    await wallet.stub.SelfExclude(pb.SelfExcludeRequest(account=player.account, days=7), metadata=ADMIN)
    await expect_error(wallet.resize_hold(hold.hold_id, 501), FAILED, "SELF_EXCLUDED")
    # Lowering what is at stake is always allowed.
    assert (await wallet.resize_hold(hold.hold_id, 100)).hold.amount_minor == 100
    assert await wallet.balance(player.account) == (9_900, 100)


async def test_a_conditional_resize_applies_only_to_the_amount_it_expects(wallet: Wallet) -> None:
    """Two changes made from one reading of a 300 hold, to 900 and to 400, each naming the 300 it replaces:
    the first applies, the second is refused HOLD_CHANGED and changes nothing (no movement, no event)."""
    player = await wallet.player(deposit_minor=1_000)
    hold = await wallet.hold(player.account, 300, "r1")
    grown = await wallet.resize_hold(hold.hold_id, 900, "rs-a", expected_minor=300)
    assert grown.hold.amount_minor == 900
    before = await snapshot(wallet, hold.hold_id)
    await expect_error(
        wallet.resize_hold(hold.hold_id, 400, "rs-b", expected_minor=300),
        grpc.StatusCode.FAILED_PRECONDITION,
        "HOLD_CHANGED",
    )
    assert await snapshot(wallet, hold.hold_id) == before
    assert await wallet.count_events(events.HOLD_RESIZED) == 1
    back = await wallet.resize_hold(hold.hold_id, 300, "rs-undo", expected_minor=900)  # an undo names what it undoes
    assert back.hold.amount_minor == 300 and await wallet.balance(player.account) == (700, 300)
    await expect_error(
        wallet.resize_hold(hold.hold_id, 300, expected_minor=-1), grpc.StatusCode.INVALID_ARGUMENT, "EXPECTED_INVALID"
    )


async def test_a_resize_id_is_an_idempotency_key(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=1_000)
    hold = await wallet.hold(player.account, 300, "r1")
    other = await wallet.hold(player.account, 100, "r1")
    first = await wallet.resize_hold(hold.hold_id, 500, "rs-1")
    again = await wallet.resize_hold(hold.hold_id, 500, "rs-1")
    assert not first.replayed and again.replayed and again.hold == first.hold
    assert await wallet.balance(player.account) == (400, 600)
    assert await wallet.count_events(events.HOLD_RESIZED) == 1

    before = await snapshot(wallet, hold.hold_id)
    reused = grpc.StatusCode.ALREADY_EXISTS
    await expect_error(wallet.resize_hold(hold.hold_id, 400, "rs-1"), reused, "RESIZE_ID_REUSED")
    await expect_error(wallet.resize_hold(other.hold_id, 500, "rs-1"), reused, "RESIZE_ID_REUSED")
    assert await snapshot(wallet, hold.hold_id) == before

    # A later resize moves from the current amount; a repeat of the first still answers with the hold as it is.
    await wallet.resize_hold(hold.hold_id, 250, "rs-2")
    repeat = await wallet.resize_hold(hold.hold_id, 500, "rs-1")
    assert repeat.replayed and repeat.hold.amount_minor == 250
    await wallet.stub.VoidHold(pb.VoidHoldRequest(hold_id=hold.hold_id), metadata=TABLE)
    repeat = await wallet.resize_hold(hold.hold_id, 500, "rs-1")
    assert repeat.replayed and repeat.hold.status == pb.HOLD_STATUS_VOIDED
    assert await wallet.balance(player.account) == (900, 100)


async def test_only_an_open_hold_is_resized(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=1_000)
    posted = await wallet.hold(player.account, 100)
    await wallet.stub.PostHold(
        pb.PostHoldRequest(hold_id=posted.hold_id, postings=[pb.Posting(payee="house", amount_minor=50)]),
        metadata=TABLE,
    )
    voided = await wallet.hold(player.account, 100)
    await wallet.stub.VoidHold(pb.VoidHoldRequest(hold_id=voided.hold_id), metadata=TABLE)
    late = await wallet.hold(player.account, 100)
    wallet.clock.advance(timedelta(hours=1))  # its expiry (the domain tests cover it before the sweep)
    deadline = time.monotonic() + 10
    while (await get_hold(wallet, late.hold_id)).status != pb.HOLD_STATUS_EXPIRED:
        assert time.monotonic() < deadline, "the sweeper did not expire the hold"
        await asyncio.sleep(0.05)
    before = await wallet.balances()
    for hold_id in (posted.hold_id, voided.hold_id):
        await expect_error(wallet.resize_hold(hold_id, 60), FAILED, "HOLD_ALREADY_RESOLVED")
    await expect_error(wallet.resize_hold(late.hold_id, 60), FAILED, "HOLD_EXPIRED")
    await expect_error(wallet.resize_hold("no-such-hold", 60), grpc.StatusCode.NOT_FOUND, "HOLD_NOT_FOUND")
    assert await wallet.balances() == before
    assert await wallet.sql("SELECT count(*) FROM wallet_hold_resizes") == [(0,)]


async def test_a_resized_hold_settles_at_its_new_amount_and_the_ledger_agrees(wallet: Wallet) -> None:
    bettor, banker = await wallet.player(1_000), await wallet.player(5_000)
    bet = await wallet.hold(bettor.account, 300, "round-1")
    capital = await wallet.hold(banker.account, 2_000, "round-1")
    await wallet.resize_hold(bet.hold_id, 500)  # the bet grew
    await wallet.resize_hold(capital.hold_id, 1_500)  # the banker's capital shrank
    before = await wallet.balances()

    settlement = settled(
        "round-1",
        [
            transfer(bettor.account, banker.account, 400, "loss", bet.hold_id),  # 400 of the 500 now held
            transfer(banker.account, "commission_revenue", 20, "commission", capital.hold_id),
            transfer("house", bettor.account, 7, "rebate"),
        ],
        [bet.hold_id, capital.hold_id],
    )
    await wallet.settle_direct(ROUND_SETTLED, settlement, "round-1")
    status = await wallet.stub.GetRoundSettlement(pb.GetRoundSettlementRequest(round_id="round-1"), metadata=ADMIN)
    assert (status.status, status.reason) == ("settled", "")

    after = await wallet.balances()
    assert after[bettor.account] == (1_000 - 400 + 7, 0)
    assert after[banker.account] == (5_000 + 400 - 20, 0)
    assert sum(av + held for av, held in after.values()) == sum(av + held for av, held in before.values()) == 0
    bet_after, capital_after = await get_hold(wallet, bet.hold_id), await get_hold(wallet, capital.hold_id)
    assert (bet_after.amount_minor, bet_after.posted_minor, bet_after.released_minor) == (500, 400, 100)
    assert (capital_after.amount_minor, capital_after.posted_minor, capital_after.released_minor) == (1_500, 20, 1_480)
    await wallet.ledger_agrees()
    assert await wallet.verify_round(settlement) == []  # every hold's held legs net to zero, resizes included
