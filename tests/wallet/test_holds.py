"""Holds through gRPC on the real stack: concurrency, idempotency, post/void/expiry exactly once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from datetime import timedelta

import grpc
import pytest
from niuniu.wallet.v1 import wallet_pb2 as pb
from prometheus_client import REGISTRY
from wallet_helpers import ADMIN, TABLE, Wallet, expect_error, wallet_service

from services.wallet import events

pytestmark = pytest.mark.integration

INVALID = grpc.StatusCode.INVALID_ARGUMENT
FAILED = grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture
async def wallet(infra: dict[str, str], unique: str) -> AsyncIterator[Wallet]:
    async with wallet_service(infra, unique) as w:
        yield w


async def test_200_concurrent_holds_never_take_an_account_below_zero(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=10_050)

    async def try_hold(i: int) -> bool:
        try:
            await wallet.hold(player.account, 100, hold_id=f"race-{i}")
        except grpc.aio.AioRpcError as error:
            assert error.code() == FAILED and "INSUFFICIENT_FUNDS" in (error.details() or "")
            return False
        return True

    results = await asyncio.gather(*(try_hold(i) for i in range(200)))
    assert sum(results) == 100
    assert await wallet.balance(player.account) == (50, 10_000)
    rows = await wallet.sql("SELECT count(*), sum(amount_minor) FROM wallet_holds WHERE status = 'open'")
    assert rows == [(100, 10_000)]
    assert await wallet.count_events(events.HOLD_PLACED) == 100


async def test_concurrent_holds_of_many_players_are_placed_in_groups_each_decided_on_its_own(wallet: Wallet) -> None:
    """PlaceHold calls that arrive together share a transaction (group commit); each is still
    decided alone: a refusal writes nothing and the others are placed, a repeat answers replayed,
    two holds on one account never see the same balance."""
    rich = [await wallet.player(deposit_minor=1_000) for _ in range(24)]
    poor = [await wallet.player(deposit_minor=50) for _ in range(8)]
    twice = rich[:6]  # a second hold each, on the same account
    repeated = rich[6:12]  # the same hold asked twice
    groups_before = counter("niuniu_wallet_hold_group_size_count")
    holds_before = counter("niuniu_wallet_hold_group_size_sum")

    async def place(account: str, hold_id: str, amount: int) -> pb.HoldResult | grpc.aio.AioRpcError:
        request = pb.PlaceHoldRequest(hold_id=hold_id, account=account, amount_minor=amount, reason="bet", round_id="r")
        try:
            reply: pb.HoldResult = await wallet.stub.PlaceHold(request, metadata=TABLE)
        except grpc.aio.AioRpcError as error:
            return error
        return reply

    calls = [
        *(place(p.account, f"g-{p.account}", 100) for p in rich + poor),
        *(place(p.account, f"g2-{p.account}", 600) for p in twice),
        *(place(p.account, f"g-{p.account}", 100) for p in repeated),
    ]
    outcomes = await asyncio.gather(*calls)
    refused = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
    assert len(refused) == len(poor)
    assert all(e.code() == FAILED and "INSUFFICIENT_FUNDS" in (e.details() or "") for e in refused)
    replies = [o for o in outcomes if isinstance(o, pb.HoldResult)]
    assert sum(r.replayed for r in replies) == len(repeated)
    assert len({r.hold.hold_id for r in replies}) == len(rich) + len(twice)

    for p in rich:
        expected_held = 100 + (600 if p in twice else 0)
        assert await wallet.balance(p.account) == (1_000 - expected_held, expected_held)
    for p in poor:
        assert await wallet.balance(p.account) == (50, 0)
    assert await wallet.count_events(events.HOLD_PLACED) == len(rich) + len(twice)
    # Every account's stream has versions 1..n without a gap, and its version is the account's own.
    rows = await wallet.sql(
        "SELECT e.stream_id, count(*), max(e.version), min(a.version) FROM events e"
        " JOIN wallet_accounts a ON e.stream_id = 'account-' || a.account GROUP BY e.stream_id"
    )
    assert len(rows) >= len(rich) + len(poor)
    assert all(n == last == version for _, n, last, version in rows), rows

    calls_grouped = counter("niuniu_wallet_hold_group_size_sum") - holds_before
    groups = counter("niuniu_wallet_hold_group_size_count") - groups_before
    assert calls_grouped == len(calls)  # every call went through a group, once
    assert groups < len(calls)  # and some groups held several calls


async def test_place_holds_decides_each_hold_alone_in_one_call(wallet: Wallet) -> None:
    """PlaceHolds: one outcome per hold, in order, each what PlaceHold alone would answer; the refused
    ones write nothing, the others are placed, all in one group."""
    rich, other, poor = [await wallet.player(deposit_minor=d) for d in (1_000, 1_000, 50)]

    def ask(hold_id: str, account: str, amount: int) -> pb.PlaceHoldRequest:
        return pb.PlaceHoldRequest(hold_id=hold_id, account=account, amount_minor=amount, reason="bet", round_id="r")

    earlier = (await wallet.stub.PlaceHold(ask("pb.earlier", rich.account, 100), metadata=TABLE)).hold
    await wallet.stub.PlaceHold(ask("pb.taken", other.account, 100), metadata=TABLE)

    groups_before = counter("niuniu_wallet_hold_group_size_count")
    reasons = ("INSUFFICIENT_FUNDS", "HOLD_ID_INVALID", "HOLD_ID_REUSED")
    refused_before = [refused_count(r) for r in reasons]
    reply = await wallet.stub.PlaceHolds(
        pb.PlaceHoldsRequest(
            holds=[
                ask("pb.1", rich.account, 300),
                ask("pb.2", poor.account, 100),  # more than the player has
                ask("pb.earlier", rich.account, 100),  # asked before: replayed
                ask("bad id", other.account, 100),
                ask("pb.3", other.account, 200),
                ask("pb.taken", other.account, 300),  # an earlier hold's id, another amount
                ask("pb.4", rich.account, 500),  # the same account again, on what pb.1 left
            ]
        ),
        metadata=TABLE,
    )
    kinds = [o.WhichOneof("outcome") for o in reply.outcomes]
    assert kinds == ["placed", "refused", "placed", "refused", "placed", "refused", "placed"]
    placed = [o.placed for o in reply.outcomes if o.HasField("placed")]
    assert [(p.hold.hold_id, p.hold.amount_minor, p.replayed) for p in placed] == [
        ("pb.1", 300, False),
        ("pb.earlier", 100, True),
        ("pb.3", 200, False),
        ("pb.4", 500, False),
    ]
    assert placed[1].hold == earlier
    refusals = [(o.refused.code, o.refused.reason) for o in reply.outcomes if o.HasField("refused")]
    assert refusals == [
        (FAILED.value[0], "INSUFFICIENT_FUNDS"),
        (INVALID.value[0], "HOLD_ID_INVALID"),
        (grpc.StatusCode.ALREADY_EXISTS.value[0], "HOLD_ID_REUSED"),
    ]
    assert all(o.refused.message for o in reply.outcomes if o.HasField("refused"))
    # The call itself answered OK: the refusals are counted for the dashboards by reason.
    assert [refused_count(r) - before for r, before in zip(reasons, refused_before, strict=True)] == [1, 1, 1]
    assert await wallet.balance(rich.account) == (100, 900)
    assert await wallet.balance(other.account) == (700, 300)
    assert await wallet.balance(poor.account) == (50, 0)
    assert await wallet.count_events(events.HOLD_PLACED) == 5  # earlier, taken, pb.1, pb.3, pb.4
    # The whole call went in one group, rich's three holds too. (Two holds with one id in one call would race,
    # as two PlaceHold calls do: they never share a group, and groups run side by side.)
    assert counter("niuniu_wallet_hold_group_size_count") - groups_before == 1


async def test_one_accounts_holds_in_one_group_are_decided_in_order_on_what_the_earlier_left(
    wallet: Wallet,
) -> None:
    """Holds of 600, 500 and 300 on 1 000 available, in one call and one group: the first is placed, the
    second is refused (400 left), the third is placed on those 400; the account's events take consecutive
    versions, the account's own version is the last."""
    player = await wallet.player(deposit_minor=1_000)
    groups_before = counter("niuniu_wallet_hold_group_size_count")
    asked = [("in-order.1", 600), ("in-order.2", 500), ("in-order.3", 300)]
    reply = await wallet.stub.PlaceHolds(
        pb.PlaceHoldsRequest(
            holds=[
                pb.PlaceHoldRequest(hold_id=h, account=player.account, amount_minor=a, reason="bet", round_id="r")
                for h, a in asked
            ]
        ),
        metadata=TABLE,
    )
    assert [o.WhichOneof("outcome") for o in reply.outcomes] == ["placed", "refused", "placed"]
    assert reply.outcomes[1].refused.reason == "INSUFFICIENT_FUNDS"
    assert counter("niuniu_wallet_hold_group_size_count") - groups_before == 1
    # Written by one transaction: the group did not fail and fall back to one transaction a hold.
    writers = await wallet.sql("SELECT DISTINCT xmin::text FROM wallet_holds WHERE hold_id LIKE 'in-order.%%'")
    assert len(writers) == 1, writers
    assert await wallet.balance(player.account) == (100, 900)
    rows = await wallet.sql(
        "SELECT e.version, a.version FROM events e JOIN wallet_accounts a ON e.stream_id = 'account-' || a.account"
        " WHERE a.account = %s ORDER BY e.version",
        player.account,
    )
    versions = [v for v, _ in rows]
    assert versions == list(range(1, len(versions) + 1)) and rows[-1][1] == versions[-1], rows


@pytest.mark.parametrize("count", [0, 65])
async def test_place_holds_takes_1_to_64_holds(wallet: Wallet, count: int) -> None:
    player = await wallet.player(deposit_minor=1_000)
    holds = [
        pb.PlaceHoldRequest(hold_id=f"n.{i}", account=player.account, amount_minor=1, reason="bet")
        for i in range(count)
    ]
    await expect_error(
        wallet.stub.PlaceHolds(pb.PlaceHoldsRequest(holds=holds), metadata=TABLE), INVALID, "HOLDS_COUNT"
    )
    assert await wallet.balance(player.account) == (1_000, 0)


async def test_a_hold_id_is_an_idempotency_key(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=1_000)
    request = pb.PlaceHoldRequest(
        hold_id="bet.1", account=player.account, amount_minor=300, reason="bet", round_id="r1"
    )
    first = await wallet.stub.PlaceHold(request, metadata=TABLE)
    again = await wallet.stub.PlaceHold(request, metadata=TABLE)
    assert not first.replayed and again.replayed
    assert again.hold == first.hold
    assert await wallet.balance(player.account) == (700, 300)

    changed = pb.PlaceHoldRequest()
    changed.CopyFrom(request)
    changed.amount_minor = 301
    await expect_error(wallet.stub.PlaceHold(changed, metadata=TABLE), grpc.StatusCode.ALREADY_EXISTS, "HOLD_ID_REUSED")
    other = await wallet.player(deposit_minor=1_000)
    changed.CopyFrom(request)
    changed.account = other.account
    await expect_error(wallet.stub.PlaceHold(changed, metadata=TABLE), grpc.StatusCode.ALREADY_EXISTS, "HOLD_ID_REUSED")
    assert await wallet.balance(player.account) == (700, 300)
    assert await wallet.balance(other.account) == (1_000, 0)


async def test_post_pays_part_and_releases_the_rest_once(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=1_000)
    banker = await wallet.player()
    hold = await wallet.hold(player.account, 500, round_id="r1")
    post = pb.PostHoldRequest(
        hold_id=hold.hold_id,
        postings=[pb.Posting(payee=banker.account, amount_minor=150), pb.Posting(payee="house", amount_minor=50)],
    )
    posted = await wallet.stub.PostHold(post, metadata=TABLE)
    assert posted.hold.status == pb.HOLD_STATUS_POSTED
    assert (posted.hold.posted_minor, posted.hold.released_minor) == (200, 300)
    assert await wallet.balance(player.account) == (800, 0)
    assert await wallet.balance(banker.account) == (150, 0)
    house = await wallet.balance("house")

    repeat = await wallet.stub.PostHold(post, metadata=TABLE)
    assert repeat.replayed and repeat.hold == posted.hold
    different = pb.PostHoldRequest(hold_id=hold.hold_id, postings=[pb.Posting(payee="house", amount_minor=1)])
    await expect_error(wallet.stub.PostHold(different, metadata=TABLE), FAILED, "HOLD_ALREADY_RESOLVED")
    void = pb.VoidHoldRequest(hold_id=hold.hold_id)
    await expect_error(wallet.stub.VoidHold(void, metadata=ADMIN), FAILED, "HOLD_ALREADY_RESOLVED")
    assert await wallet.balance(player.account) == (800, 0)
    assert await wallet.balance("house") == house
    assert await wallet.count_events(events.HOLD_POSTED) == 1

    movements = await wallet.stub.ListMovements(
        pb.ListMovementsRequest(account=player.account), metadata=player.metadata
    )
    kinds = [(m.kind, m.available_delta_minor, m.held_delta_minor) for m in movements.movements]
    assert kinds == [
        ("void", 300, -300),
        ("post", 0, -50),
        ("post", 0, -150),
        ("hold", -500, 500),
        ("deposit", 1000, 0),
    ]


async def test_void_releases_everything_and_a_repeat_answers_the_same(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=1_000)
    hold = await wallet.hold(player.account, 400)
    voided = await wallet.stub.VoidHold(pb.VoidHoldRequest(hold_id=hold.hold_id), metadata=TABLE)
    again = await wallet.stub.VoidHold(pb.VoidHoldRequest(hold_id=hold.hold_id), metadata=TABLE)
    assert voided.hold.status == pb.HOLD_STATUS_VOIDED and not voided.replayed
    assert again.replayed and again.hold == voided.hold
    post = pb.PostHoldRequest(hold_id=hold.hold_id, postings=[pb.Posting(payee="house", amount_minor=1)])
    await expect_error(wallet.stub.PostHold(post, metadata=TABLE), FAILED, "HOLD_ALREADY_RESOLVED")
    assert await wallet.balance(player.account) == (1_000, 0)
    assert await wallet.count_events(events.HOLD_VOIDED) == 1


async def test_concurrent_post_and_void_resolve_a_hold_exactly_once(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=10_000)
    holds = [await wallet.hold(player.account, 100) for _ in range(20)]

    async def resolve(hold_id: str) -> None:
        post = pb.PostHoldRequest(hold_id=hold_id, postings=[pb.Posting(payee="house", amount_minor=100)])
        calls: list[Awaitable[object]] = [
            wallet.stub.PostHold(post, metadata=TABLE),
            wallet.stub.VoidHold(pb.VoidHoldRequest(hold_id=hold_id), metadata=TABLE),
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert sum(not isinstance(r, Exception) for r in results) == 1, results

    await asyncio.gather(*(resolve(h.hold_id) for h in holds))
    posted = await wallet.sql("SELECT count(*) FROM wallet_holds WHERE status = 'posted'")
    available, held = await wallet.balance(player.account)
    assert held == 0 and available == 10_000 - 100 * posted[0][0]
    resolutions = await wallet.count_events(events.HOLD_POSTED) + await wallet.count_events(events.HOLD_VOIDED)
    assert resolutions == 20


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def refused_count(reason: str) -> float:
    return REGISTRY.get_sample_value("niuniu_wallet_holds_refused_total", {"reason": reason}) or 0.0


async def test_the_sweeper_expires_holds_past_their_time(wallet: Wallet) -> None:
    player = await wallet.player(deposit_minor=1_000)
    expires = pb.PlaceHoldRequest(
        hold_id="short",
        account=player.account,
        amount_minor=600,
        reason="bet",
        expires_at_unix_ms=int((wallet.clock() + timedelta(minutes=5)).timestamp() * 1000),
    )
    await wallet.stub.PlaceHold(expires, metadata=TABLE)
    lasting = await wallet.hold(player.account, 100)  # default: an hour
    expired_before = counter("niuniu_wallet_holds_expired_total")
    wallet.clock.advance(timedelta(minutes=6))
    post = pb.PostHoldRequest(hold_id="short", postings=[pb.Posting(payee="house", amount_minor=1)])
    await expect_error(wallet.stub.PostHold(post, metadata=TABLE), FAILED, "HOLD_EXPIRED")
    deadline = time.monotonic() + 10
    while (await wallet.balance(player.account)) != (900, 100):
        assert time.monotonic() < deadline, "the sweeper did not expire the hold"
        await asyncio.sleep(0.05)
    short = await wallet.stub.GetHold(pb.GetHoldRequest(hold_id="short"), metadata=TABLE)
    assert short.status == pb.HOLD_STATUS_EXPIRED and short.resolved_by == "expire"
    assert (await wallet.stub.GetHold(pb.GetHoldRequest(hold_id=lasting.hold_id), metadata=TABLE)).status == (
        pb.HOLD_STATUS_OPEN
    )
    assert counter("niuniu_wallet_holds_expired_total") == expired_before + 1
    # Voiding an expired hold is not a conflict: it is already released.
    assert (await wallet.stub.VoidHold(pb.VoidHoldRequest(hold_id="short"), metadata=TABLE)).replayed
    await expect_error(wallet.stub.PostHold(post, metadata=TABLE), FAILED, "HOLD_EXPIRED")
    open_holds = await wallet.stub.ListHolds(pb.ListHoldsRequest(account=player.account), metadata=player.metadata)
    assert [h.hold_id for h in open_holds.holds] == [lasting.hold_id]
    every = await wallet.stub.ListHolds(
        pb.ListHoldsRequest(account=player.account, include_resolved=True, page_size=1), metadata=ADMIN
    )
    assert len(every.holds) == 1 and every.next_page_token
    rest = await wallet.stub.ListHolds(
        pb.ListHoldsRequest(account=player.account, include_resolved=True, page_token=every.next_page_token),
        metadata=ADMIN,
    )
    assert [h.hold_id for h in [*every.holds, *rest.holds]] == [lasting.hold_id, "short"]


async def test_get_holds_answers_the_holds_found_in_one_call_and_refuses_bad_ids_whole(wallet: Wallet) -> None:
    """GetHolds: every hold found, as GetHold has it (resolved ones too), an unknown id simply absent,
    a repeated id answered once; too many ids, or one malformed id among good ones, refuse the call."""
    alice, bob = await wallet.player(deposit_minor=1_000), await wallet.player(deposit_minor=1_000)
    kept, voided, theirs = (
        await wallet.hold(alice.account, 100, round_id="r-1"),
        await wallet.hold(alice.account, 200),
        await wallet.hold(bob.account, 300),
    )
    await wallet.stub.VoidHold(pb.VoidHoldRequest(hold_id=voided.hold_id), metadata=TABLE)
    ids = [kept.hold_id, "h-nowhere", voided.hold_id, theirs.hold_id, kept.hold_id]
    reply = await wallet.stub.GetHolds(pb.GetHoldsRequest(hold_ids=ids), metadata=TABLE)
    got = {h.hold_id: h for h in reply.holds}
    assert len(reply.holds) == 3 and set(got) == {kept.hold_id, voided.hold_id, theirs.hold_id}
    for hold_id, hold in got.items():
        assert hold == await wallet.stub.GetHold(pb.GetHoldRequest(hold_id=hold_id), metadata=TABLE)
    assert (got[kept.hold_id].status, got[kept.hold_id].round_id) == (pb.HOLD_STATUS_OPEN, "r-1")
    assert got[voided.hold_id].status == pb.HOLD_STATUS_VOIDED and got[theirs.hold_id].account == bob.account
    assert not (await wallet.stub.GetHolds(pb.GetHoldsRequest(), metadata=TABLE)).holds

    at_most = pb.GetHoldsRequest(hold_ids=[kept.hold_id] + [f"h-{i}" for i in range(999)])
    assert len((await wallet.stub.GetHolds(at_most, metadata=TABLE)).holds) == 1
    too_many = pb.GetHoldsRequest(hold_ids=[kept.hold_id] + [f"h-{i}" for i in range(1000)])
    await expect_error(wallet.stub.GetHolds(too_many, metadata=TABLE), INVALID, "HOLD_IDS_COUNT")
    for bad in ("", "a/b", "x" * 129):
        request = pb.GetHoldsRequest(hold_ids=[kept.hold_id, bad])
        await expect_error(wallet.stub.GetHolds(request, metadata=ADMIN), INVALID, "HOLD_ID_INVALID")
    assert await wallet.balance(alice.account) == (900, 100)  # reading changed nothing
