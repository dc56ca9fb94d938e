"""Responsible play: loss and deposit limits, self-exclusion, the 24-hour wait for loosening (clock moved)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import grpc
import pytest
from niuniu.wallet.v1 import wallet_pb2 as pb
from wallet_helpers import ADMIN, TABLE, Player, Wallet, expect_error, settled, transfer, wallet_service

from services.wallet import events
from services.wallet.settlement import ROUND_SETTLED

pytestmark = pytest.mark.integration

FAILED = grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture
async def wallet(infra: dict[str, str], unique: str) -> AsyncIterator[Wallet]:
    async with wallet_service(infra, unique) as w:
        yield w


async def set_limit(wallet: Wallet, player: Player, kind: pb.LimitKind.ValueType, value: int) -> pb.ResponsiblePlay:
    request = pb.SetLimitRequest(account=player.account, kind=kind, value=value)
    reply: pb.ResponsiblePlay = await wallet.stub.SetLimit(request, metadata=player.metadata)
    return reply


def limit(play: pb.ResponsiblePlay, kind: int) -> pb.Limit:
    return next(item for item in play.limits if item.kind == kind)


async def lose(wallet: Wallet, player: Player, amount: int, round_id: str) -> None:
    hold = await wallet.hold(player.account, amount, round_id)
    await wallet.settle_direct(
        ROUND_SETTLED,
        settled(round_id, [transfer(player.account, "house", amount, hold_id=hold.hold_id)], [hold.hold_id]),
        round_id,
    )


async def test_loss_limit_refuses_holds_and_raising_it_waits_24_hours(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=10_000)
    play = await set_limit(wallet, player, pb.LIMIT_KIND_DAILY_LOSS, 500)
    assert limit(play, pb.LIMIT_KIND_DAILY_LOSS).value == 500  # a first limit is a tightening: at once

    await lose(wallet, player, 300, "r1")
    error = await expect_error(wallet.hold(player.account, 300), FAILED, "LOSS_LIMIT_REACHED")
    assert "daily_loss" in (error.details() or "")
    small = await wallet.hold(player.account, 200)  # 300 lost + 200 at risk == the limit
    await expect_error(wallet.hold(player.account, 1), FAILED, "LOSS_LIMIT_REACHED")  # open holds count too
    await wallet.stub.VoidHold(pb.VoidHoldRequest(hold_id=small.hold_id), metadata=TABLE)

    play = await set_limit(wallet, player, pb.LIMIT_KIND_DAILY_LOSS, 5_000)
    daily = limit(play, pb.LIMIT_KIND_DAILY_LOSS)
    assert (daily.value, daily.has_pending, daily.pending_value, daily.used_minor) == (500, True, 5_000, 300)
    assert daily.pending_effective_at_unix_ms == int((wallet.clock() + timedelta(hours=24)).timestamp() * 1000)
    await expect_error(wallet.hold(player.account, 300), FAILED, "LOSS_LIMIT_REACHED")

    wallet.clock.advance(timedelta(hours=23, minutes=59))
    await expect_error(wallet.hold(player.account, 300), FAILED, "LOSS_LIMIT_REACHED")
    wallet.clock.advance(timedelta(minutes=2))
    hold = await wallet.hold(player.account, 3_000)
    assert hold.status == pb.HOLD_STATUS_OPEN
    play = await wallet.stub.GetResponsiblePlay(pb.GetResponsiblePlayRequest(), metadata=player.metadata)
    daily = limit(play, pb.LIMIT_KIND_DAILY_LOSS)
    assert (daily.value, daily.has_pending, daily.used_minor) == (5_000, False, 0)  # the loss left the window

    # Lowering is at once, and cancels a pending raise.
    await set_limit(wallet, player, pb.LIMIT_KIND_WEEKLY_LOSS, 10_000)
    await set_limit(wallet, player, pb.LIMIT_KIND_DAILY_LOSS, 8_000)  # pending
    play = await set_limit(wallet, player, pb.LIMIT_KIND_DAILY_LOSS, 3_100)
    daily = limit(play, pb.LIMIT_KIND_DAILY_LOSS)
    assert (daily.value, daily.has_pending) == (3_100, False)
    await expect_error(wallet.hold(player.account, 101), FAILED, "LOSS_LIMIT_REACHED")
    # The weekly window still remembers the 300 lost yesterday.
    assert limit(play, pb.LIMIT_KIND_WEEKLY_LOSS).used_minor == 300

    # Removing a limit is a loosening too.
    play = await set_limit(wallet, player, pb.LIMIT_KIND_DAILY_LOSS, 0)
    assert limit(play, pb.LIMIT_KIND_DAILY_LOSS).value == 3_100
    assert await wallet.count_events(events.LIMITS_CHANGED) == 6


async def test_deposit_limits(wallet: Wallet) -> None:
    player = await wallet.player()
    await wallet.stub.SetLimit(
        pb.SetLimitRequest(account=player.account, kind=pb.LIMIT_KIND_DAILY_DEPOSIT, value=1_000), metadata=ADMIN
    )
    await wallet.deposit(player.account, 600)
    await expect_error(wallet.deposit(player.account, 500), FAILED, "DEPOSIT_LIMIT_REACHED")
    await wallet.deposit(player.account, 400)
    assert await wallet.balance(player.account) == (1_000, 0)
    wallet.clock.advance(timedelta(hours=24, seconds=1))
    await wallet.deposit(player.account, 1_000)
    await set_limit(wallet, player, pb.LIMIT_KIND_WEEKLY_DEPOSIT, 2_500)
    await expect_error(wallet.deposit(player.account, 1), FAILED, "DEPOSIT_LIMIT_REACHED")
    assert await wallet.balance(player.account) == (2_000, 0)


async def test_self_exclusion_refuses_holds_for_its_period_or_for_ever(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=1_000)
    open_hold = await wallet.hold(player.account, 100)
    play = await wallet.stub.SelfExclude(
        pb.SelfExcludeRequest(account=player.account, days=7), metadata=player.metadata
    )
    assert play.self_excluded and not play.self_excluded_permanently
    error = await expect_error(wallet.hold(player.account, 100), FAILED, "SELF_EXCLUDED")
    assert "until" in (error.details() or "")
    # Money already at stake still settles, and withdrawals still work.
    await wallet.stub.VoidHold(pb.VoidHoldRequest(hold_id=open_hold.hold_id), metadata=TABLE)
    await wallet.stub.Withdraw(
        pb.WithdrawRequest(request_id="w1", account=player.account, amount_minor=100), metadata=ADMIN
    )
    await expect_error(
        wallet.stub.SelfExclude(pb.SelfExcludeRequest(account=player.account, days=1), metadata=player.metadata),
        FAILED,
        "SELF_EXCLUSION_ACTIVE",
    )
    wallet.clock.advance(timedelta(days=7, seconds=1))
    await wallet.hold(player.account, 100)

    play = await wallet.stub.SelfExclude(pb.SelfExcludeRequest(permanent=True), metadata=player.metadata)
    assert play.self_excluded_permanently
    wallet.clock.advance(timedelta(days=3650))
    await expect_error(wallet.hold(player.account, 100), FAILED, "SELF_EXCLUDED")
    assert await wallet.count_events(events.SELF_EXCLUDED) == 2


async def test_reality_check_interval_is_stored_and_returned(wallet: Wallet) -> None:
    player = await wallet.player()
    play = await set_limit(wallet, player, pb.LIMIT_KIND_REALITY_CHECK_MINUTES, 30)
    assert play.reality_check_minutes == 30
    play = await set_limit(wallet, player, pb.LIMIT_KIND_REALITY_CHECK_MINUTES, 60)
    assert play.reality_check_minutes == 60  # not a money limit: changes at once
    await expect_error(
        set_limit(wallet, player, pb.LIMIT_KIND_REALITY_CHECK_MINUTES, 100_000),
        grpc.StatusCode.INVALID_ARGUMENT,
        "LIMIT_INVALID",
    )
