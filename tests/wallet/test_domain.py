"""The wallet's pure rules: no database, no clock, no network."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backbone.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from services.wallet import domain, domain_holds, domain_play, domain_settlement
from services.wallet.domain import AccountKind, AccountState, Bucket, HoldStatus
from services.wallet.domain_holds import Hold, HoldRequest, Resize, ResizeRequest
from services.wallet.domain_play import Exclusion, LimitKind, LimitSetting, ResponsiblePlay
from services.wallet.domain_settlement import SettlementCommand, SettlementRejected, SettlementTransfer

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
ALICE = "player:11111111-1111-4111-8111-111111111111"
BOB = "player:22222222-2222-4222-8222-222222222222"
CAROL = "player:33333333-3333-4333-8333-333333333333"


def accounts(**available: int) -> dict[str, AccountState]:
    names = {"alice": ALICE, "bob": BOB, "carol": CAROL}
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
    first = domain_play.decide_limit_change(none, 500, NOW)
    assert first == LimitSetting(LimitKind.DAILY_LOSS, 500)
    raised = domain_play.decide_limit_change(first, 900, NOW)
    assert raised.in_force(NOW) == 500
    assert raised.in_force(NOW + timedelta(hours=24) - timedelta(microseconds=1)) == 500
    assert raised.in_force(NOW + timedelta(hours=24)) == 900
    lowered = domain_play.decide_limit_change(raised, 400, NOW + timedelta(hours=1))
    assert lowered == LimitSetting(LimitKind.DAILY_LOSS, 400)
    removed = domain_play.decide_limit_change(lowered, 0, NOW)
    assert removed.in_force(NOW) == 400 and removed.in_force(NOW + timedelta(days=1)) == 0
    reality = domain_play.decide_limit_change(LimitSetting(LimitKind.REALITY_CHECK_MINUTES, 10), 60, NOW)
    assert reality.in_force(NOW) == 60


def test_self_exclusion_can_be_extended_never_shortened() -> None:
    week = domain_play.decide_self_exclusion(Exclusion(), 7, False, NOW)
    assert week.active(NOW + timedelta(days=6)) and not week.active(NOW + timedelta(days=7))
    assert domain_play.decide_self_exclusion(week, 30, False, NOW).until == NOW + timedelta(days=30)
    with pytest.raises(FailedPrecondition):
        domain_play.decide_self_exclusion(week, 1, False, NOW)
    forever = domain_play.decide_self_exclusion(week, 0, True, NOW)
    assert forever.active(NOW + timedelta(days=100_000))
    with pytest.raises(FailedPrecondition):
        domain_play.decide_self_exclusion(forever, 3650, False, NOW)
    assert domain_play.decide_self_exclusion(week, 1, False, NOW + timedelta(days=8)).active(NOW + timedelta(days=8))


def test_place_hold_checks_exclusion_then_losses_then_funds() -> None:
    alice = accounts(alice=1_000)[ALICE]
    request = HoldRequest("h1", ALICE, 600, "bet", "r1", 0)
    excluded = ResponsiblePlay(exclusion=Exclusion(None, True))
    with pytest.raises(FailedPrecondition, match="SELF_EXCLUDED"):
        domain_holds.decide_place_hold(request, None, alice, excluded, NOW)
    limited = ResponsiblePlay(
        limits={LimitKind.WEEKLY_LOSS: LimitSetting(LimitKind.WEEKLY_LOSS, 1_000)},
        used_minor={LimitKind.WEEKLY_LOSS: 401},
    )
    with pytest.raises(FailedPrecondition, match="LOSS_LIMIT_REACHED"):
        domain_holds.decide_place_hold(request, None, alice, limited, NOW)
    with pytest.raises(FailedPrecondition, match="INSUFFICIENT_FUNDS"):
        domain_holds.decide_place_hold(HoldRequest("h1", ALICE, 1_001, "", "", 0), None, alice, ResponsiblePlay(), NOW)
    placed = domain_holds.decide_place_hold(request, None, alice, ResponsiblePlay(), NOW)
    assert placed.hold.expires_at == NOW + domain.DEFAULT_HOLD_TTL
    assert domain_holds.decide_place_hold(request, placed.hold, alice, excluded, NOW).replayed
    with pytest.raises(AlreadyExists, match="HOLD_ID_REUSED"):
        domain_holds.decide_place_hold(HoldRequest("h1", ALICE, 601, "bet", "r1", 0), placed.hold, alice, excluded, NOW)


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
    plan = domain_settlement.decide_settlement(command, before, holds, NOW)
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
        # A player pays without a hold only from what earlier transfers of the settlement paid it.
        (
            (SettlementTransfer("house", ALICE, 100, "win"), SettlementTransfer(ALICE, BOB, 101, "win")),
            "PAYER_NOT_SYSTEM",
        ),
        (
            (SettlementTransfer(ALICE, BOB, 100, "win"), SettlementTransfer("house", ALICE, 100, "win")),
            "PAYER_NOT_SYSTEM",
        ),
        (
            (
                SettlementTransfer("house", ALICE, 100, "win"),
                SettlementTransfer(ALICE, BOB, 60, "win"),
                SettlementTransfer(ALICE, "fees", 41, "dealer_fee"),
            ),
            "PAYER_NOT_SYSTEM",
        ),
        ((SettlementTransfer("house", BOB, 100, "win"), SettlementTransfer(ALICE, BOB, 1, "win")), "PAYER_NOT_SYSTEM"),
    ],
)
def test_invalid_settlements_are_rejected_whole(transfers: tuple[SettlementTransfer, ...], reason: str) -> None:
    holds = {"ha": hold("ha", ALICE, 500), "other-round": hold("other-round", ALICE, 5, "r0")}
    before = accounts(alice=0, bob=0)
    before[ALICE] = AccountState(ALICE, AccountKind.PLAYER, 0, 505)
    with pytest.raises(SettlementRejected) as info:
        domain_settlement.decide_settlement(SettlementCommand("r1", "t1", transfers, ("ha",)), before, holds, NOW)
    assert info.value.reason == reason


def test_a_player_pays_on_from_what_the_settlement_paid_it_before() -> None:
    """Red-envelope dealer: pays the winner from its pool hold, then from the losers' payments."""
    holds = {"pool": hold("pool", ALICE, 1_000), "hb": hold("hb", BOB, 300)}
    before = accounts(alice=0, bob=0, carol=0)
    before[ALICE] = AccountState(ALICE, AccountKind.PLAYER, 1_000, 1_000)
    before[BOB] = AccountState(BOB, AccountKind.PLAYER, 0, 300)
    transfers = (
        SettlementTransfer(BOB, ALICE, 300, "loss", "b1", "hb"),
        SettlementTransfer(ALICE, CAROL, 1_000, "win", "b2", "pool"),
        SettlementTransfer(ALICE, CAROL, 250, "win", "b2"),
        SettlementTransfer(ALICE, "fees", 50, "dealer_fee"),
    )
    plan = domain_settlement.decide_settlement(
        SettlementCommand("r1", "t1", transfers, ("pool", "hb")), before, holds, NOW
    )
    assert plan.accounts_after[ALICE] == AccountState(ALICE, AccountKind.PLAYER, 1_000, 0)  # its own 1 000 untouched
    assert plan.accounts_after[CAROL].available_minor == 1_250
    assert plan.player_net_minor == {ALICE: -1_000, BOB: -300, CAROL: 1_250}
    hold_less = plan.movements[2]
    assert hold_less.legs == (
        domain.Leg(ALICE, Bucket.AVAILABLE, -250),
        domain.Leg(CAROL, Bucket.AVAILABLE, 250),
    )
    assert hold_less.hold_id == "" and hold_less.bet_id == "b2"


def test_resize_moves_the_difference_and_refuses_what_place_hold_refuses() -> None:
    placed = hold("h1", ALICE, 300)
    alice = AccountState(ALICE, AccountKind.PLAYER, 700, 300)
    up = domain_holds.decide_resize(ResizeRequest("rs1", "h1", 500), None, placed, alice, ResponsiblePlay(), NOW)
    assert up.hold.amount_minor == 500 and up.hold.request == placed.request
    assert up.resize == Resize(ResizeRequest("rs1", "h1", 500), 300, NOW)
    (movement,) = up.movements
    assert (movement.movement_id, movement.kind, movement.hold_id, movement.round_id) == (
        "resize:rs1",
        "hold_resize",
        "h1",
        "r1",
    )
    assert movement.legs == (domain.Leg(ALICE, Bucket.AVAILABLE, -200), domain.Leg(ALICE, Bucket.HELD, 200))
    down = domain_holds.decide_resize(ResizeRequest("rs2", "h1", 120), None, up.hold, alice, ResponsiblePlay(), NOW)
    assert down.movements[0].legs == (domain.Leg(ALICE, Bucket.HELD, -380), domain.Leg(ALICE, Bucket.AVAILABLE, 380))
    same = domain_holds.decide_resize(ResizeRequest("rs3", "h1", 120), None, down.hold, alice, ResponsiblePlay(), NOW)
    assert same.movements == () and same.resize is not None and same.hold == down.hold

    # A repeat answers with the hold as it is; the id with other values is refused.
    assert domain_holds.decide_resize(up.resize.request, up.resize, down.hold, alice, ResponsiblePlay(), NOW) == (
        domain_holds.Decision(down.hold, replayed=True)
    )
    with pytest.raises(AlreadyExists, match="RESIZE_ID_REUSED"):
        domain_holds.decide_resize(ResizeRequest("rs1", "h1", 501), up.resize, down.hold, alice, ResponsiblePlay(), NOW)
    # PlaceHold's repeat is still compared with the amount placed.
    assert domain_holds.decide_place_hold(placed.request, down.hold, alice, ResponsiblePlay(), NOW).replayed

    def refused(reason: str, amount: int, h: Hold = placed, play: ResponsiblePlay | None = None) -> None:
        with pytest.raises(FailedPrecondition, match=reason):
            domain_holds.decide_resize(
                ResizeRequest("rs9", "h1", amount), None, h, alice, play or ResponsiblePlay(), NOW
            )

    refused("INSUFFICIENT_FUNDS", 1_001)
    refused("SELF_EXCLUDED", 301, play=ResponsiblePlay(exclusion=Exclusion(None, True)))
    limited = ResponsiblePlay(limits={LimitKind.DAILY_LOSS: LimitSetting(LimitKind.DAILY_LOSS, 400)})
    refused("LOSS_LIMIT_REACHED", 401, play=limited)  # 300 held + 101 more
    assert domain_holds.decide_resize(ResizeRequest("rs9", "h1", 400), None, placed, alice, limited, NOW).movements
    # Lowering is allowed to the excluded and the limited alike.
    excluded = ResponsiblePlay(exclusion=Exclusion(None, True))
    assert domain_holds.decide_resize(ResizeRequest("rs9", "h1", 1), None, placed, alice, excluded, NOW).movements
    refused("HOLD_ALREADY_RESOLVED", 200, domain_holds.decide_void(placed, NOW).hold)
    refused("HOLD_EXPIRED", 200, replace(placed, expires_at=NOW))  # past its time, not yet swept
    for bad in (ResizeRequest("", "h1", 1), ResizeRequest("rs", "h 1", 1), ResizeRequest("rs", "h1", 0)):
        with pytest.raises(InvalidArgument):
            domain_holds.check_resize_request(bad)


def test_a_resized_hold_settles_and_voids_at_its_current_amount() -> None:
    resized = replace(hold("ha", ALICE, 300), resized_minor=500)
    before = accounts(alice=0)
    before[ALICE] = AccountState(ALICE, AccountKind.PLAYER, 0, 500)
    command = SettlementCommand("r1", "t1", (SettlementTransfer(ALICE, "house", 400, "loss", "b1", "ha"),), ("ha",))
    plan = domain_settlement.decide_settlement(command, before, {"ha": resized}, NOW)
    (settled_hold,) = plan.holds
    assert (settled_hold.posted_minor, settled_hold.released_minor) == (400, 100)
    assert plan.accounts_after[ALICE] == AccountState(ALICE, AccountKind.PLAYER, 100, 0)
    too_much = replace(command, transfers=(SettlementTransfer(ALICE, "house", 501, "loss", "b1", "ha"),))
    with pytest.raises(SettlementRejected, match="HOLD_INSUFFICIENT"):
        domain_settlement.decide_settlement(too_much, before, {"ha": resized}, NOW)
    assert domain_holds.decide_void(resized, NOW).movements[0].legs[1] == domain.Leg(ALICE, Bucket.AVAILABLE, 500)


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
    plan = domain_settlement.decide_settlement(
        SettlementCommand("r1", "t1", tuple(transfers), tuple(holds)), before, holds, NOW
    )
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
