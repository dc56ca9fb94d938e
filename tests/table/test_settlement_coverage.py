"""The table checks a round's holds with the wallet before it settles (``services/table/coverage.py``).

A bet whose hold the wallet no longer has open, or holds for less than the table
recorded, is refunded and left out of the settlement, so the wallet applies the
rest of the round instead of refusing it whole; a dealer's hold that does not cover
the round voids it. Played in process (``table_rig``): the fake wallet refuses a
settlement as the real one does (``SettlementRefused``), so a round the check let
through uncovered fails the test.
"""

from __future__ import annotations

import pytest
from psycopg_pool import AsyncConnectionPool

from backbone.errors import FailedPrecondition
from bull.money import Settlement, Transfer, TransferKind
from bull.variants import Funding, TableBet
from services.table import metrics, repair
from services.table.common import Phase, scoped_id
from services.table.coverage import Need, covered_settlement, refusal
from services.table.ports import WalletHold
from services.table.round_base import SETTLE_CHECK_PATIENCE
from tests.table.table_rig import Rig, player, setup_schema

START = 10_000_000
BALANCES = {f"player:p{i}": START for i in range(6)} | {"house": 0}


@pytest.fixture
async def rig(pool: AsyncConnectionPool) -> Rig:
    return Rig(pool, await setup_schema(pool), BALANCES)


def held(rig: Rig, kind: str, who: str, command_id: str) -> str:
    """The wallet hold of a player's bet or bid (command ids are per player; each attempt has a hold of its
    own, ``<kind>.<id>.<attempt>``)."""
    prefix = f"{kind}.{scoped_id(f'player:{who}', command_id)}."
    (hold_id,) = [hold_id for hold_id in rig.wallet.holds if hold_id.startswith(prefix)]
    return hold_id


def shrink(rig: Rig, hold_id: str, amount_minor: int) -> None:
    """What a lost ChangeBet race leaves: the wallet holds less than the table recorded."""
    hold = rig.wallet.holds[hold_id]
    rig.wallet.available[hold.account] += hold.amount_minor - amount_minor
    hold.amount_minor = amount_minor


def refunded_count(reason: str) -> float:
    return float(metrics.BETS_REFUNDED_UNCOVERED.labels(reason)._value.get())


def checks(result: str) -> float:
    return float(metrics.SETTLEMENT_CHECKS.labels(result)._value.get())


async def test_bets_the_wallet_does_not_cover_are_refunded_and_the_rest_of_the_round_settles(rig: Rig) -> None:
    await rig.create("gb", "golden_bull")
    current = await rig.to_phase("gb", Phase.BETTING)
    bets = [await rig.app.place_bet(player(f"p{i}"), f"b{i}", "gb", f"area_{i + 1}", 1_000) for i in range(3)]
    holds = [bet.hold_id for bet in bets]
    await rig.to_phase("gb", Phase.REVEALING)  # betting has closed: the bets are final
    shrink(rig, holds[1], 1)
    await rig.wallet.void_hold(holds[2])
    insufficient, not_open = refunded_count("HOLD_INSUFFICIENT"), refunded_count("HOLD_NOT_OPEN")
    ended = await rig.finish("gb")  # the fake wallet raises SettlementRefused on a settlement it refuses
    assert ended["phase"] == Phase.SETTLED
    settled = await rig.settled(current["round_id"])
    assert [b.bet_id for b in settled.bets] == [bets[0].bet_id]
    assert set(holds) <= set(settled.hold_ids)  # every hold of the round is still released
    assert {t.hold_id for t in settled.transfers if t.hold_id} <= {holds[0]}
    stored = {b["bet_id"]: b for b in await rig.app.round_bets(current["round_id"])}
    for refunded in bets[1:]:
        assert (stored[refunded.bet_id]["status"], stored[refunded.bet_id]["outcome"]) == ("refunded", "refund")
        assert stored[refunded.bet_id]["net_minor"] == 0
    assert stored[bets[0].bet_id]["status"] == "settled"
    assert rig.wallet.applied[current["round_id"]] == "settled"
    assert rig.wallet.available["player:p1"] == rig.wallet.available["player:p2"] == START
    assert rig.wallet.available["player:p0"] == START + settled.bets[0].net_minor
    assert rig.conserved() and rig.open_holds() == []
    assert refunded_count("HOLD_INSUFFICIENT") == insufficient + 1
    assert refunded_count("HOLD_NOT_OPEN") == not_open + 1
    assert await rig.audit("gb", current["round_id"]) == []  # what was settled recomputes exactly


async def test_a_dealer_hold_that_does_not_cover_the_round_voids_it_and_releases_every_hold(rig: Rig) -> None:
    await rig.create("re", "red_envelope_bull", {"bidding.seconds": "5"})
    current = await rig.to_phase("re", Phase.BIDDING)
    await rig.app.envelope.place_bid(player("p1"), "bid", "re", 20_000)
    bid = held(rig, "bid", "p1", "bid")
    await rig.to_phase("re", Phase.BETTING)
    for i in (2, 3):
        await rig.app.place_bet(player(f"p{i}"), f"e{i}", "re", "dealer", 1_000)
    await rig.to_phase("re", Phase.REVEALING)
    await rig.wallet.void_hold(bid)
    voids = checks("voided")
    ended = await rig.finish("re")
    assert ended["phase"] == Phase.VOIDED and ended["void_reason"].startswith("DEALER_HOLD_UNCOVERED: HOLD_NOT_OPEN")
    voided = await rig.voided(current["round_id"])
    assert bid in voided.hold_ids and len(voided.hold_ids) >= 3
    assert rig.wallet.applied[current["round_id"]] == "voided"
    assert all(rig.wallet.available[f"player:p{i}"] == START for i in (1, 2, 3))
    assert rig.conserved() and rig.open_holds() == []
    assert checks("voided") == voids + 1


async def test_a_wallet_that_does_not_answer_holds_the_round_then_it_settles_unchecked(rig: Rig) -> None:
    await rig.create("gw", "golden_bull")
    current = await rig.to_phase("gw", Phase.BETTING)
    await rig.app.place_bet(player("p0"), "b0", "gw", "area_1", 1_000)
    await rig.to_phase("gw", Phase.SETTLING)
    rig.wallet.unavailable = 10**6
    unchecked = checks("unchecked")
    assert await rig.step("gw") > 0  # waits for the wallet
    assert (await rig.current("gw"))["phase"] == Phase.SETTLING
    rig.clock.advance(SETTLE_CHECK_PATIENCE.total_seconds() + 1)
    await rig.step("gw")
    rig.wallet.unavailable = 0
    ended = await rig.app.round_row(current["round_id"])
    assert ended["phase"] == Phase.SETTLED and checks("unchecked") == unchecked + 1
    await rig.deliver("gw")
    assert rig.wallet.applied[current["round_id"]] == "settled" and rig.conserved()


async def test_the_repair_voids_a_settled_round_the_wallet_rejected_listing_every_hold(rig: Rig) -> None:
    await rig.create("bb", "baibian_bull", {"banker.min_capital_minor": "100000"})
    await rig.app.banker.apply(player("p5"), "bb", 1_000_000)
    current = await rig.next_round("bb")
    for i in range(2):
        await rig.app.place_bet(player(f"p{i}"), f"b{i}", "bb", "heaven", 10_000)
    ended = await rig.finish("bb")
    round_id = current["round_id"]
    with pytest.raises(FailedPrecondition, match="ROUND_NOT_REJECTED"):  # the wallet applied it: nothing to do
        await repair.void_round(rig.app, rig.wallet, round_id, "REPAIRED")
    assert ended["phase"] == Phase.SETTLED
    rig.wallet.applied[round_id] = "rejected"  # as if the wallet had refused the settlement
    assert await repair.void_round(rig.app, rig.wallet, round_id, "REPAIRED: test") == "voided"
    row = await rig.app.round_row(round_id)
    assert (row["phase"], row["void_reason"]) == (Phase.VOIDED, "REPAIRED: test")
    voided = await rig.voided(round_id)
    settled = await rig.settled(round_id)
    assert set(voided.hold_ids) == set(settled.hold_ids)  # the bets' holds and the banker's
    assert any(h.startswith("banker.") for h in voided.hold_ids) and len(voided.hold_ids) == 3
    assert {b["status"] for b in await rig.app.round_bets(round_id)} == {"refunded"}
    assert await repair.void_round(rig.app, rig.wallet, round_id, "REPAIRED: again") == "already voided"
    assert len((await rig.round_events(round_id))["table.round_voided"]) == 1


# ---------------------------------------------------------------------- the rule, pure


def hold(hold_id: str, account: str, amount: int, *, is_open: bool = True, round_id: str = "r1") -> WalletHold:
    return WalletHold(hold_id, account, amount, round_id, is_open)


def test_a_hold_covers_a_need_only_when_open_the_payers_of_the_round_and_large_enough() -> None:
    need = Need("player:a", 100)
    assert refusal(hold("h", "player:a", 100), need, "r1") == ""
    assert refusal(hold("h", "player:a", 100, round_id=""), need, "r1") == ""
    assert refusal(None, need, "r1") == "HOLD_NOT_FOUND"
    assert refusal(hold("h", "player:a", 100, is_open=False), need, "r1") == "HOLD_NOT_OPEN"
    assert refusal(hold("h", "player:b", 100), need, "r1") == "HOLD_WRONG_ACCOUNT"
    assert refusal(hold("h", "player:a", 100, round_id="r2"), need, "r1") == "HOLD_ROUND_MISMATCH"
    assert refusal(hold("h", "player:a", 99), need, "r1") == "HOLD_INSUFFICIENT"


def test_leaving_a_bet_out_settles_again_until_every_hold_covers_what_is_taken() -> None:
    """A dealer who pays one winner out of another's loss: without the loser, the dealer's hold must pay."""
    bets = [TableBet("win", "player:w", "dealer", 100, "hw"), TableBet("lose", "player:l", "dealer", 100, "hl")]
    funding = Funding(dealer="player:d", dealer_hold_id="hd", dealer_hold_minor=50)

    def settle(some: object) -> Settlement:
        ids = {b.bet_id for b in some}  # type: ignore[attr-defined]
        transfers = [Transfer("player:l", "player:d", 100, TransferKind.LOSS, "lose", "hl")] if "lose" in ids else []
        if "win" in ids:  # paid from what the loser paid, else from the dealer's hold
            transfers.append(
                Transfer("player:d", "player:w", 100, TransferKind.WIN, "win", "" if "lose" in ids else "hd")
            )
        return Settlement((), tuple(transfers))

    recorded = {"hw": Need("player:w", 100), "hl": Need("player:l", 100)}
    holds = {"hw": hold("hw", "player:w", 100), "hl": hold("hl", "player:l", 10), "hd": hold("hd", "player:d", 50)}
    verdict = covered_settlement(settle, bets, recorded, funding, holds, "r1")
    assert verdict.refunded == {"lose": "HOLD_INSUFFICIENT"}
    assert verdict.void_reason.startswith("HOLD_INSUFFICIENT")  # the dealer's 50 cannot pay the 100 won
    holds["hd"] = hold("hd", "player:d", 500)
    verdict = covered_settlement(settle, bets, recorded, replace_hold(funding, 500), holds, "r1")
    assert verdict.void_reason == "" and [b.bet_id for b in verdict.live] == ["win"]
    assert verdict.settlement is not None and [t.hold_id for t in verdict.settlement.transfers] == ["hd"]


def replace_hold(funding: Funding, amount: int) -> Funding:
    return Funding(funding.dealer, funding.dealer_hold_id, amount)
