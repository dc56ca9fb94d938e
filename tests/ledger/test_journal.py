"""From wallet events to balanced entries: the chart, the generic walk, the refusals (no infrastructure)."""

from __future__ import annotations

import uuid

import pytest
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory, struct_pb2
from hypothesis import given
from hypothesis import strategies as st
from niuniu.ledger.v1 import ledger_pb2
from niuniu.v1 import events_pb2
from niuniu.wallet.v1 import events_pb2 as wallet_pb2

from services.ledger.accounts import AccountError, account_type
from services.ledger.journal import Entry, Journaled, Line, Reason, Rejected, build_entry, journal_event
from services.ledger.synthetic import (
    AVAILABLE,
    HELD,
    SyntheticStream,
    deposited,
    hold_placed,
    hold_resized,
    leg,
    movement,
)


def envelope(payload: object, event_type: str = "wallet.test", correlation_id: str = "") -> events_pb2.EventEnvelope:
    packed = any_pb2.Any()
    packed.Pack(payload)  # type: ignore[arg-type]
    return events_pb2.EventEnvelope(
        event_id=str(uuid.uuid4()), event_type=event_type, correlation_id=correlation_id, payload=packed
    )


@pytest.mark.parametrize(
    ("account", "kind"),
    [
        ("player:42", ledger_pb2.ACCOUNT_TYPE_PLAYER_LIABILITY),
        ("house", ledger_pb2.ACCOUNT_TYPE_HOUSE_EQUITY),
        ("commission_revenue", ledger_pb2.ACCOUNT_TYPE_REVENUE),
        ("fees", ledger_pb2.ACCOUNT_TYPE_REVENUE),
        ("rebate_expense", ledger_pb2.ACCOUNT_TYPE_EXPENSE),
        ("jackpot_pool", ledger_pb2.ACCOUNT_TYPE_JACKPOT_LIABILITY),
        ("external:cashier", ledger_pb2.ACCOUNT_TYPE_EXTERNAL_ASSET),
    ],
)
def test_chart_of_accounts_derives_the_type_from_the_name(account: str, kind: int) -> None:
    assert account_type(account) == kind


@pytest.mark.parametrize("account", ["", "player:", "casino", " house", "external:", "x" * 300])
def test_names_outside_the_chart_are_refused(account: str) -> None:
    with pytest.raises(AccountError):
        account_type(account)


def test_a_deposit_is_a_debit_to_the_cashier_and_a_credit_to_the_player() -> None:
    journaled = journal_event(envelope(deposited("player:1", 500, "dep-1").payload, "wallet.deposited"))
    assert journaled.rejected == ()
    (entry,) = journaled.entries
    assert entry.entry_id == "dep-1" and entry.kind == "deposit"
    assert entry.lines == (Line("external:cashier", "available", 500, 0), Line("player:1", "available", 0, 500))


def test_a_cash_movement_names_its_request_in_its_own_field_not_the_round() -> None:
    """A deposit's event correlates with the cashier's request id: a statement line shows it in the
    entry id (the movement's own reference), and no round, since no round moved the money."""
    event = envelope(deposited("player:1", 500, "deposit:staff:req-7").payload, "wallet.deposited", "req-7")
    (entry,) = journal_event(event).entries
    assert entry.entry_id == "deposit:staff:req-7" and entry.round_id == ""
    held = wallet_pb2.HoldVoided(
        hold_id="h-9",
        cause="void",
        movement=movement("m-9", "void", leg("player:1", HELD, -5), leg("player:1", AVAILABLE, 5)),
    )
    (entry,) = journal_event(envelope(held, "wallet.hold_voided", correlation_id="h-9")).entries
    assert entry.hold_id == "h-9" and entry.round_id == ""  # a hold outside any round


def test_every_movement_of_an_event_is_found_and_references_default_to_the_event() -> None:
    posted = wallet_pb2.HoldPosted(
        hold_id="h-1",
        posted_minor=70,
        released_minor=30,
        movements=[
            movement("", "post", leg("player:1", HELD, -70), leg("house", AVAILABLE, 70)),
            movement("m-2", "void", leg("player:1", HELD, -30), leg("player:1", AVAILABLE, 30)),
        ],
    )
    event = envelope(posted, "wallet.hold_posted", correlation_id="round-9")
    entries = journal_event(event).entries
    assert [e.entry_id for e in entries] == [f"{event.event_id}:0", "m-2"]
    assert {e.hold_id for e in entries} == {"h-1"} and {e.round_id for e in entries} == {"round-9"}


def test_an_event_without_movements_journals_nothing() -> None:
    opened = wallet_pb2.AccountOpened(account="player:1", username="ann", role="player")
    assert journal_event(envelope(opened, "wallet.account_opened")).entries == ()
    assert journal_event(envelope(opened, "wallet.account_opened")).rejected == ()


def _new_event_type() -> type:
    """A wallet event type this code has never heard of, carrying movements two levels down."""
    name = f"ledger_test_{uuid.uuid4().hex[:8]}"
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"{name}.proto", package=name, dependency=["niuniu/wallet/v1/events.proto"], syntax="proto3"
    )
    inner = proto.message_type.add(name="Part")
    inner.field.add(name="moves", number=1, type=11, label=3, type_name=".niuniu.wallet.v1.Movement")
    outer = proto.message_type.add(name="JackpotWon")
    outer.field.add(name="round_id", number=1, type=9, label=1)
    outer.field.add(name="part", number=2, type=11, label=1, type_name=f".{name}.Part")
    descriptor_pool.Default().Add(proto)
    return message_factory.GetMessageClass(descriptor_pool.Default().FindMessageTypeByName(f"{name}.JackpotWon"))


def test_a_new_wallet_event_type_with_nested_movements_is_journaled_without_a_code_change() -> None:
    jackpot_won = _new_event_type()
    event = jackpot_won(round_id="round-7")
    event.part.moves.add().CopyFrom(
        movement("jp-1", "jackpot_payout", leg("jackpot_pool", AVAILABLE, -900), leg("player:3", AVAILABLE, 900))
    )
    (entry,) = journal_event(envelope(event, "wallet.jackpot_won")).entries
    assert entry.entry_id == "jp-1" and entry.round_id == "round-7" and entry.debit_minor == entry.credit_minor == 900


@pytest.mark.parametrize(
    ("legs", "reason"),
    [
        ((leg("player:1", AVAILABLE, -100), leg("house", AVAILABLE, 90)), Reason.UNBALANCED),
        ((), Reason.NO_LEGS),
        ((leg("casino", AVAILABLE, -5), leg("house", AVAILABLE, 5)), Reason.ACCOUNT_INVALID),
        ((leg("player:1", wallet_pb2.BUCKET_UNSPECIFIED, -5), leg("house", AVAILABLE, 5)), Reason.BUCKET_INVALID),
        ((leg("player:1", AVAILABLE, -(10**16)), leg("house", AVAILABLE, 10**16)), Reason.AMOUNT_OUT_OF_RANGE),
    ],
)
def test_a_malformed_movement_is_rejected_with_its_reason(legs: tuple[wallet_pb2.Leg, ...], reason: str) -> None:
    result = build_entry("e-1", 0, movement("m-1", "loss", *legs))
    assert isinstance(result, Rejected) and result.reason == reason and result.entry_id == "m-1"


def test_an_unknown_payload_is_rejected_not_dropped() -> None:
    event = envelope(struct_pb2.Struct(), "wallet.unheard_of")
    event.payload.type_url = "type.googleapis.com/niuniu.wallet.v9.Unheard"
    (rejected,) = journal_event(event).rejected
    assert rejected.reason == Reason.PAYLOAD_UNDECODABLE
    event.event_type = "table.unheard_of"  # another service's unknown event carries no money for us
    assert journal_event(event) == Journaled((), ())


amounts = st.lists(st.integers(min_value=-(10**12), max_value=10**12), min_size=1, max_size=8)


@given(amounts)
def test_an_entry_balances_exactly_when_its_legs_sum_to_zero(parts: list[int]) -> None:
    legs = [leg(f"player:{i}", AVAILABLE, amount) for i, amount in enumerate(parts)]
    result = build_entry("e", 0, movement("m", "win", *legs))
    if sum(parts) == 0:
        assert isinstance(result, Entry) and result.debit_minor == result.credit_minor
        assert all((line.debit_minor == 0) != (line.credit_minor == 0) for line in result.lines)
    else:
        assert isinstance(result, Rejected) and result.reason == Reason.UNBALANCED


def test_the_synthetic_stream_balances_and_journals_without_rejects() -> None:
    stream = SyntheticStream(seed=3)
    types = set()
    for item in stream.events(300):
        types.add(item.event.event_type)
        if item.target == "wallet":
            assert journal_event(envelope(item.event.payload, item.event.event_type)).rejected == ()
    assert "wallet.hold_resized" in types
    assert sum(stream.expected.values()) == 0
    assert all(v == 0 for (account, bucket), v in stream.expected.items() if bucket == "held")


def test_hold_placed_moves_available_to_held() -> None:
    (entry,) = journal_event(envelope(hold_placed("player:2", 300, "h-2", "r-1").payload)).entries
    assert entry.hold_id == "h-2" and entry.round_id == "r-1"
    assert entry.lines == (Line("player:2", "available", 300, 0), Line("player:2", "held", 0, 300))


def test_a_resize_is_journaled_on_its_hold_and_round() -> None:
    (up,) = journal_event(envelope(hold_resized("player:2", 300, 500, "h-2", "rs-1", "r-1").payload)).entries
    assert (up.entry_id, up.kind, up.hold_id, up.round_id) == ("rs-1:resize", "hold_resize", "h-2", "r-1")
    assert up.lines == (Line("player:2", "available", 200, 0), Line("player:2", "held", 0, 200))
    (down,) = journal_event(envelope(hold_resized("player:2", 500, 100, "h-2", "rs-2", "r-1").payload)).entries
    assert down.lines == (Line("player:2", "held", 400, 0), Line("player:2", "available", 0, 400))
    # A resize to the same amount moves nothing and carries no movement.
    same = wallet_pb2.HoldResized(hold_id="h-2", resize_id="rs-3", previous_minor=100, amount_minor=100)
    assert journal_event(envelope(same, "wallet.hold_resized", "r-1")) == Journaled((), ())
