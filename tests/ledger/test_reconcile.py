"""The reconciliation logic on hand-made journals and a fake wallet (no infrastructure)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from datetime import UTC, datetime

from niuniu.table.v1 import events_pb2 as table_pb2

from services.ledger.journal import Line
from services.ledger.queries import EntryRecord, RoundRecord
from services.ledger.reconcile import (
    WalletBalance,
    compare_journals,
    compare_with_wallet,
    ledger_account,
)
from services.ledger.verify import RoundEvidence, verify

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def entry(entry_id: str, offset: int, *lines: Line, kind: str = "deposit", hold_id: str = "") -> EntryRecord:
    return EntryRecord(
        entry_id, "e-" + entry_id, 0, "wallet.x", kind, "r-1", hold_id, "", T0, "w", 0, offset, offset, lines
    )


DEP = (Line("external:cashier", "available", 100, 0), Line("player:1", "available", 0, 100))


async def aiter_of(items: Iterable[EntryRecord]) -> AsyncIterator[EntryRecord]:
    for item in items:
        yield item


async def test_identical_journals_have_no_differences() -> None:
    journal = [entry("a", 0, *DEP), entry("b", 1, *DEP)]
    result = await compare_journals(aiter_of(journal), aiter_of(journal))
    assert result.compared == 2 and result.differences == []


async def test_an_altered_line_is_named_with_both_values() -> None:
    live = [
        entry("a", 0, *DEP),
        entry("b", 1, Line("external:cashier", "available", 100, 0), Line("player:1", "available", 0, 1_000)),
    ]
    result = await compare_journals(aiter_of(live), aiter_of([entry("a", 0, *DEP), entry("b", 1, *DEP)]))
    (difference,) = result.differences
    assert difference.subject == "entry b" and difference.what == "line 1"
    assert "credit=1000" in difference.live and "credit=100" in difference.other


async def test_missing_and_extra_entries_and_changed_fields_are_reported() -> None:
    replayed = [entry("a", 0, *DEP), entry("b", 1, *DEP)]
    live = [replace(entry("a", 0, *DEP), kind="withdrawal"), entry("c", 2, *DEP)]
    found = {(d.subject, d.what) for d in (await compare_journals(aiter_of(live), aiter_of(replayed))).differences}
    assert found == {
        ("entry a", "kind"),
        ("entry b", "missing from the live journal"),
        ("entry c", "only in the live journal"),
    }


async def test_entries_beyond_either_sides_stream_end_are_not_compared() -> None:
    live = [entry("a", 0, *DEP), entry("z", 9, *DEP)]
    replayed = [entry("a", 0, *DEP), entry("m", 5, *DEP)]
    result = await compare_journals(
        aiter_of(live),
        aiter_of(replayed),
        live_in_scope=lambda e: e.offset <= 5,
        replayed_in_scope=lambda e: e.offset < 1,
    )
    assert result.differences == [] and result.live_out_of_scope == 1 and result.replayed_out_of_scope == 1


class FakeWallet:
    def __init__(self, balances: dict[str, WalletBalance]) -> None:
        self._balances = balances

    async def balances(self) -> dict[str, WalletBalance]:
        return dict(self._balances)

    async def published_below(self) -> int:
        return 0  # does not say: the audit judges by Kafka's partitions


async def test_wallet_balances_are_compared_per_account_and_bucket() -> None:
    ledger = {
        ("player:1", "available"): 70,
        ("player:1", "held"): 30,
        ("player:2", "available"): 5,
        ("house", "available"): 10,
        ("external:cashier", "available"): -115,
    }
    wallet = await FakeWallet(
        {"player:1": WalletBalance(70, 30), "player:2": WalletBalance(6, 0), "player:3": WalletBalance(0, 0)}
    ).balances()
    result = compare_with_wallet(ledger, wallet)
    assert result.accounts_compared == 3
    assert [(d.subject, d.live, d.other) for d in result.differences] == [("player:2/available", "5", "6")]
    assert result.not_listed_by_wallet == ["external:cashier", "house"]


def test_a_player_the_wallet_does_not_list_is_a_difference_unless_empty() -> None:
    result = compare_with_wallet({("player:9", "available"): 1, ("player:8", "available"): 0}, {})
    assert [d.subject for d in result.differences] == ["player:9"]


def test_bare_wallet_account_ids_are_players() -> None:
    assert ledger_account("42") == "player:42" and ledger_account("house") == "house"


async def test_round_verification_matches_each_transfer_to_its_movement() -> None:
    settled = table_pb2.RoundSettled(
        round_id="r-1",
        hold_ids=["h-1"],
        transfers=[
            table_pb2.SettlementTransfer(
                payer="player:1", payee="house", amount_minor=100, kind="loss", bet_id="b-1", hold_id="h-1"
            )
        ],
    )
    hold = entry(
        "h", 0, Line("player:1", "available", 100, 0), Line("player:1", "held", 0, 100), kind="hold", hold_id="h-1"
    )
    loss = replace(
        entry("l", 1, Line("player:1", "held", 100, 0), Line("house", "available", 0, 100), kind="loss", hold_id="h-1"),
        bet_id="b-1",
    )
    good = RoundRecord("r-1", "settled", settled.SerializeToString(), (hold, loss), ())
    findings, recomputed = await verify(RoundEvidence.of(good))
    assert findings == [] and not recomputed

    short = replace(loss, lines=(Line("player:1", "held", 90, 0), Line("house", "available", 0, 90)))
    findings, _ = await verify(RoundEvidence.of(replace(good, entries=(hold, short))))
    assert {f.check for f in findings} == {"transfers", "holds"}
    assert any("transfer #0 loss player:1 -> house 100" in f.subject for f in findings)


async def test_a_resized_hold_and_a_dealer_paying_on_without_a_hold_verify() -> None:
    """Red envelope: the loser's bet grew before settling; the dealer pays its fee from the loss it got."""
    loser, dealer = "player:1", "player:2"
    settled = table_pb2.RoundSettled(
        round_id="r-1",
        hold_ids=["h-1"],
        transfers=[
            table_pb2.SettlementTransfer(
                payer=loser, payee=dealer, amount_minor=150, kind="loss", bet_id="b-1", hold_id="h-1"
            ),
            table_pb2.SettlementTransfer(payer=dealer, payee="fees", amount_minor=30, kind="dealer_fee"),
        ],
    )
    hold = entry("h", 0, Line(loser, "available", 100, 0), Line(loser, "held", 0, 100), kind="hold", hold_id="h-1")
    grown = entry(
        "rs", 1, Line(loser, "available", 50, 0), Line(loser, "held", 0, 50), kind="hold_resize", hold_id="h-1"
    )
    loss = replace(
        entry("l", 2, Line(loser, "held", 150, 0), Line(dealer, "available", 0, 150), kind="loss", hold_id="h-1"),
        bet_id="b-1",
    )
    fee = entry("f", 3, Line(dealer, "available", 30, 0), Line("fees", "available", 0, 30), kind="dealer_fee")
    good = RoundRecord("r-1", "settled", settled.SerializeToString(), (hold, grown, loss, fee), ())
    findings, _ = await verify(RoundEvidence.of(good))
    assert findings == []

    # Without the resize the hold's held legs do not net to zero; a fee movement nobody asked for is caught.
    findings, _ = await verify(RoundEvidence.of(replace(good, entries=(hold, loss, fee))))
    assert [f.check for f in findings] == ["holds"]
    unasked = table_pb2.RoundSettled()
    unasked.CopyFrom(settled)
    del unasked.transfers[1]
    findings, _ = await verify(RoundEvidence.of(replace(good, event=unasked.SerializeToString())))
    assert [(f.check, f.subject) for f in findings] == [("transfers", "entry f")]
