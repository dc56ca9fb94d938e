"""The wallet's pure rules: no database, no clock, no network."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backbone.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from services.wallet import domain
from services.wallet.domain import (
    AccountKind,
    AccountState,
    Bucket,
    Exclusion,
    Hold,
    HoldRequest,
    HoldStatus,
    LimitKind,
    LimitSetting,
    ResponsiblePlay,
    SettlementCommand,
    SettlementRejected,
    SettlementTransfer,
)

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
ALICE = "player:11111111-1111-4111-8111-111111111111"
BOB = "player:22222222-2222-4222-8222-222222222222"


def accounts(**available: int) -> dict[str, AccountState]:
    names = {"alice": ALICE, "bob": BOB}
    found = {
        name: AccountState(name, AccountKind.SYSTEM)
        for name in ("house", "commission_revenue", "rebate_expense", "jackpot_pool", "fees")
    }
    for key, value in available.items():
        found[names[key]] = AccountState(names[key], AccountKind.PLAYER, value)
    return found


def hold(hold_id: str, account: str, amount: int, round_id: str = "r1") -> Hold:
    return Hold(HoldRequest(hold_id, account, amount, "bet", round_id, 0), NOW + timedelta(hours=1), NOW)


def test_account_names() -> None:
    assert domain.account_kind(ALICE) is AccountKind.PLAYER
    assert domain.account_kind("house") is AccountKind.SYSTEM
    assert domain.account_kind("external:cashier") is AccountKind.EXTERNAL
    for bad in ("", "player:", "player:42", "player:ABCDEF00-0000-4000-8000-000000000000", "external:bank", "House"):
        with pytest.raises(InvalidArgument):
            domain.account_kind(bad)


def test_a_movement_must_balance() -> None:
    with pytest.raises(AssertionError):
        domain.Movement("m", "x", (domain.Leg(ALICE, Bucket.AVAILABLE, 5), domain.Leg("house", Bucket.AVAILABLE, -4)))


def test_loosening_a_limit_waits_24_hours_and_tightening_is_immediate() -> None:
    none = LimitSetting(LimitKind.DAILY_LOSS)
    first = domain.decide_limit_change(none, 500, NOW)
    assert first == LimitSetting(LimitKind.DAILY_LOSS, 500)
    raised = domain.decide_limit_change(first, 900, NOW)
    assert raised.in_force(NOW) == 500
    assert raised.in_force(NOW + timedelta(hours=24) - timedelta(microseconds=1)) == 500
    assert raised.in_force(NOW + timedelta(hours=24)) == 900
    lowered = domain.decide_limit_change(raised, 400, NOW + timedelta(hours=1))
    assert lowered == LimitSetting(LimitKind.DAILY_LOSS, 400)
    removed = domain.decide_limit_change(lowered, 0, NOW)
    assert removed.in_force(NOW) == 400 and removed.in_force(NOW + timedelta(days=1)) == 0
    reality = domain.decide_limit_change(LimitSetting(LimitKind.REALITY_CHECK_MINUTES, 10), 60, NOW)
    assert reality.in_force(NOW) == 60


def test_self_exclusion_can_be_extended_never_shortened() -> None:
    week = domain.decide_self_exclusion(Exclusion(), 7, False, NOW)
    assert week.active(NOW + timedelta(days=6)) and not week.active(NOW + timedelta(days=7))
    assert domain.decide_self_exclusion(week, 30, False, NOW).until == NOW + timedelta(days=30)
    with pytest.raises(FailedPrecondition):
        domain.decide_self_exclusion(week, 1, False, NOW)
    forever = domain.decide_self_exclusion(week, 0, True, NOW)
    assert forever.active(NOW + timedelta(days=100_000))
    with pytest.raises(FailedPrecondition):
        domain.decide_self_exclusion(forever, 3650, False, NOW)
    assert domain.decide_self_exclusion(week, 1, False, NOW + timedelta(days=8)).active(NOW + timedelta(days=8))


def test_place_hold_checks_exclusion_then_losses_then_funds() -> None:
    alice = accounts(alice=1_000)[ALICE]
    request = HoldRequest("h1", ALICE, 600, "bet", "r1", 0)
    excluded = ResponsiblePlay(exclusion=Exclusion(None, True))
    with pytest.raises(FailedPrecondition, match="SELF_EXCLUDED"):
        domain.decide_place_hold(request, None, alice, excluded, NOW)
    limited = ResponsiblePlay(
        limits={LimitKind.WEEKLY_LOSS: LimitSetting(LimitKind.WEEKLY_LOSS, 1_000)},
        used_minor={LimitKind.WEEKLY_LOSS: 401},
    )
    with pytest.raises(FailedPrecondition, match="LOSS_LIMIT_REACHED"):
        domain.decide_place_hold(request, None, alice, limited, NOW)
    with pytest.raises(FailedPrecondition, match="INSUFFICIENT_FUNDS"):
        domain.decide_place_hold(HoldRequest("h1", ALICE, 1_001, "", "", 0), None, alice, ResponsiblePlay(), NOW)
    placed = domain.decide_place_hold(request, None, alice, ResponsiblePlay(), NOW)
    assert placed.hold.expires_at == NOW + domain.DEFAULT_HOLD_TTL
    assert domain.decide_place_hold(request, placed.hold, alice, excluded, NOW).replayed
    with pytest.raises(AlreadyExists, match="HOLD_ID_REUSED"):
        domain.decide_place_hold(HoldRequest("h1", ALICE, 601, "bet", "r1", 0), placed.hold, alice, excluded, NOW)


def test_settlement_posts_what_was_taken_and_releases_the_rest() -> None:
    holds = {"ha": hold("ha", ALICE, 500), "hb": hold("hb", BOB, 300), "hx": hold("hx", BOB, 10)}
    command = SettlementCommand(
        "r1",
        "t1",
        (
            SettlementTransfer(ALICE, BOB, 400, "loss", "b1", "ha"),
            SettlementTransfer(ALICE, "commission_revenue", 20, "commission", "b1", "ha"),
            SettlementTransfer("house", BOB, 7, "rebate"),
        ),
        ("ha", "hb", "missing"),
    )
    before = accounts(alice=0, bob=0)
    before[ALICE] = AccountState(ALICE, AccountKind.PLAYER, 100, 500)
    before[BOB] = AccountState(BOB, AccountKind.PLAYER, 0, 310)
    plan = domain.decide_settlement(command, before, holds, NOW)
    assert plan.holds_posted == ("ha",) and plan.holds_voided == ("hb",) and plan.holds_skipped == ("missing",)
    assert plan.accounts_after[ALICE] == AccountState(ALICE, AccountKind.PLAYER, 180, 0)
    assert plan.accounts_after[BOB] == AccountState(BOB, AccountKind.PLAYER, 707, 10)
    assert plan.accounts_after["house"].available_minor == -7
    assert plan.player_net_minor == {ALICE: -420, BOB: 407}
    posted = {h.hold_id: (h.status, h.posted_minor, h.released_minor) for h in plan.holds}
    assert posted == {"ha": (HoldStatus.POSTED, 420, 80), "hb": (HoldStatus.VOIDED, 0, 300)}


@pytest.mark.parametrize(
    ("transfers", "reason"),
    [
        ((SettlementTransfer(ALICE, "house", 501, "loss", "", "ha"),), "HOLD_INSUFFICIENT"),
        ((SettlementTransfer(ALICE, "house", 1, "loss", "", "nope"),), "HOLD_NOT_FOUND"),
        ((SettlementTransfer(BOB, "house", 1, "loss", "", "ha"),), "HOLD_WRONG_ACCOUNT"),
        ((SettlementTransfer(ALICE, "house", 1, "loss"),), "PAYER_NOT_SYSTEM"),
        ((SettlementTransfer("house", "house", 1, "win"),), "TRANSFER_TO_SELF"),
        ((SettlementTransfer("house", "external:cashier", 1, "win"),), "ACCOUNT_NOT_ALLOWED"),
        ((SettlementTransfer("house", "casino", 1, "win"),), "ACCOUNT_INVALID"),
        ((SettlementTransfer("house", ALICE, -1, "win"),), "AMOUNT_INVALID"),
        ((SettlementTransfer("house", ALICE, 10**15 + 1, "win"),), "AMOUNT_INVALID"),
        ((SettlementTransfer("house", ALICE, 1, ""),), "KIND_INVALID"),
        ((SettlementTransfer("house", "player:33333333-3333-4333-8333-333333333333", 1, "win"),), "ACCOUNT_NOT_FOUND"),
        ((SettlementTransfer(ALICE, "house", 1, "loss", "", "other-round"),), "HOLD_ROUND_MISMATCH"),
    ],
)
def test_invalid_settlements_are_rejected_whole(transfers: tuple[SettlementTransfer, ...], reason: str) -> None:
    holds = {"ha": hold("ha", ALICE, 500), "other-round": hold("other-round", ALICE, 5, "r0")}
    before = accounts(alice=0, bob=0)
    before[ALICE] = AccountState(ALICE, AccountKind.PLAYER, 0, 505)
    with pytest.raises(SettlementRejected) as info:
        domain.decide_settlement(SettlementCommand("r1", "t1", transfers, ("ha",)), before, holds, NOW)
    assert info.value.reason == reason


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.integers(1, 10_000), st.lists(st.integers(1, 4_000), max_size=4)), min_size=1, max_size=5),
    st.integers(0, 1_000),
)
def test_any_valid_settlement_balances_and_resolves_each_hold_once(
    bets: list[tuple[int, list[int]]], house_pays: int
) -> None:
    """Random holds, random takes that fit them: legs balance, nothing is created, holds end posted or voided."""
    before = accounts(alice=0)
    before[ALICE] = AccountState(ALICE, AccountKind.PLAYER, 0, sum(amount for amount, _ in bets))
    holds, transfers = {}, []
    for i, (amount, takes) in enumerate(bets):
        holds[f"h{i}"] = hold(f"h{i}", ALICE, amount)
        left = amount
        for take in takes:
            if take <= left:
                transfers.append(SettlementTransfer(ALICE, "house", take, "loss", "", f"h{i}"))
                left -= take
    if house_pays:
        transfers.append(SettlementTransfer("house", ALICE, house_pays, "win"))
    plan = domain.decide_settlement(SettlementCommand("r1", "t1", tuple(transfers), tuple(holds)), before, holds, NOW)
    for movement in plan.movements:
        assert sum(leg.amount_minor for leg in movement.legs) == 0
    after = plan.accounts_after
    total_before = sum(a.available_minor + a.held_minor for a in before.values())
    assert sum(a.available_minor + a.held_minor for a in {**before, **after}.values()) == total_before
    assert after[ALICE].held_minor == 0 and after[ALICE].available_minor >= 0
    assert sorted(h.hold_id for h in plan.holds) == sorted(holds)
    for h in plan.holds:
        assert h.posted_minor + h.released_minor == h.amount_minor
        assert h.status is (HoldStatus.POSTED if h.posted_minor else HoldStatus.VOIDED)
