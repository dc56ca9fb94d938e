"""The WatchTable stream contract, every variant, in process (real TableApp and PostgreSQL, fake
rng and wallet, a fake clock): positions unique and strictly increasing; a resume after ANY
position delivers exactly the rest (nothing lost, nothing twice); unknown and expired positions
are OUT_OF_RANGE before anything is sent; betting opens with its deadline; every update carries
the server's clock; a player with money in a round gets their balance after the result, once
the wallet has applied the settlement, and a spectator gets none; GetRound lists hands in deal
order, which is the order the cards left the deck.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import pytest
from niuniu.table.v1 import events_pb2 as ev
from niuniu.table.v1 import table_pb2
from psycopg_pool import AsyncConnectionPool

from backbone.auth import Principal
from bull import fairness as fair
from bull.cards import parse_cards
from bull.variants.baibian_bull import dealt_prefix
from services.table import watch
from services.table.api import TableServicer
from services.table.common import Phase, unix_ms, variant_of
from services.table.core.evolve import EVENT_TYPES, fold_round
from services.table.core.state import RoundState
from services.table.core.view import round_view
from tests.table.table_rig import AuditorTokens, Rig, player, setup_schema

BALANCES = {f"player:p{i}": 10_000_000 for i in range(6)} | {"house": 0}
BETTOR, SPECTATOR = player("p0"), player("p4")
SEEDS = ("alice-42", "b0b")  # the two bettors' client seeds in every round played here
WITHDRAWN = "c4r0l"  # Golden Bull: a cancelled bet's, which does not count


@pytest.fixture
async def rig(pool: AsyncConnectionPool) -> Rig:
    return Rig(pool, await setup_schema(pool), BALANCES)


@pytest.fixture(autouse=True)
def quick_heartbeats(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # A heartbeat marks "caught up" for collect(); the table's own clock is the fake one.
    monkeypatch.setattr(watch, "HEARTBEAT_S", 0.05)
    yield


def kind(update: table_pb2.TableUpdate) -> str:
    return update.WhichOneof("update") or ""


async def collect(rig: Rig, who: Principal, table_id: str, after: int) -> list[table_pb2.TableUpdate]:
    """Everything the stream has after ``after``, up to the first heartbeat (nothing more to send)."""
    table, _ = await rig.app.get_table(table_id)
    stream = watch.watch_table(rig.app.ctx, None, who, table, after)
    out: list[table_pb2.TableUpdate] = []
    try:
        async for update in stream:
            if kind(update) == "heartbeat":
                return out
            out.append(update)
    finally:
        await stream.aclose()
    raise AssertionError("the stream ended")


async def first_position(rig: Rig, table_id: str) -> int:
    """A resume point before the table's first round: after its creation event."""
    async with rig.pool.connection() as conn:
        cur = await conn.execute("SELECT min(position) FROM events WHERE stream_id = %s", (f"table-{table_id}",))
        row = await cur.fetchone()
    assert row is not None and row[0] is not None
    return int(row[0]) * watch.SLOTS + watch.SLOTS - 1


async def play_golden_bull(rig: Rig, table_id: str) -> None:
    await rig.create(table_id, "golden_bull")
    await rig.to_phase(table_id, Phase.BETTING)
    await rig.app.place_bet(BETTOR, "b1", table_id, "area_1", 1_000, client_seed=SEEDS[0])
    await rig.app.place_bet(player("p1"), "b2", table_id, "area_2", 2_000, client_seed=SEEDS[1])
    cancelled = await rig.app.place_bet(BETTOR, "b3", table_id, "area_3", 500, client_seed=WITHDRAWN)
    assert cancelled.client_seed == WITHDRAWN  # the receipt echoes the contribution
    await rig.app.cancel_bet(BETTOR, table_id, cancelled.bet_id)
    await rig.finish(table_id)


async def play_bai_buu(rig: Rig, table_id: str) -> None:
    await rig.create(table_id, "bai_buu")
    await rig.to_phase(table_id, Phase.BETTING)
    await rig.app.place_bet(BETTOR, "b1", table_id, "player_01", 1_000, client_seed=SEEDS[0])
    await rig.app.place_bet(player("p1"), "b2", table_id, "banker_02", 1_000, client_seed=SEEDS[1])
    await rig.finish(table_id)


async def play_baibian(rig: Rig, table_id: str) -> None:
    await rig.create(table_id, "baibian_bull")
    await rig.app.banker.apply(player("p5"), table_id, 5_000_000)
    await rig.next_round(table_id)
    await rig.app.place_bet(BETTOR, "b1", table_id, "heaven", 1_000, client_seed=SEEDS[0])
    await rig.app.place_bet(player("p1"), "b2", table_id, "earth", 1_000, client_seed=SEEDS[1])
    await rig.finish(table_id)


async def play_red_envelope(rig: Rig, table_id: str) -> None:
    await rig.create(table_id, "red_envelope_bull", {"bidding.seconds": "5"})
    await rig.to_phase(table_id, Phase.BIDDING)
    await rig.app.envelope.place_bid(player("p1"), "bid-a", table_id, 10_000)
    await rig.to_phase(table_id, Phase.BETTING)
    await rig.app.place_bet(BETTOR, "e0", table_id, "dealer", 1_000, client_seed=SEEDS[0])
    await rig.app.place_bet(player("p2"), "e2", table_id, "dealer", 1_000, client_seed=SEEDS[1])
    await rig.finish(table_id)


PLAYS: dict[str, Callable[[Rig, str], Awaitable[None]]] = {
    "golden_bull": play_golden_bull,
    "bai_buu": play_bai_buu,
    "baibian_bull": play_baibian,
    "red_envelope_bull": play_red_envelope,
}


def comparable(updates: list[table_pb2.TableUpdate]) -> list[bytes]:
    out = []
    for update in updates:
        copy = table_pb2.TableUpdate()
        copy.CopyFrom(update)
        copy.ClearField("server_time_unix_ms")  # the clock when sent, not part of what happened
        out.append(copy.SerializeToString(deterministic=True))
    return out


@pytest.mark.parametrize("variant", sorted(PLAYS))
async def test_resume_after_every_position_delivers_exactly_the_rest(rig: Rig, variant: str) -> None:
    table_id = variant.replace("_", "-")
    await PLAYS[variant](rig, table_id)
    await rig.next_round(table_id, Phase.BETTING if variant != "red_envelope_bull" else Phase.BIDDING)
    start = await first_position(rig, table_id)
    for who in (BETTOR, SPECTATOR):
        everything = await collect(rig, who, table_id, start)
        positions = [u.position for u in everything]
        assert positions == sorted(set(positions)), "positions must be unique and strictly increasing"
        assert len(everything) > 10 and kind(everything[0]) == "round_opened"
        now_ms = unix_ms(rig.clock())
        assert all(u.server_time_unix_ms == now_ms for u in everything)
        want = comparable(everything)
        for i, update in enumerate(everything):
            resumed = await collect(rig, who, table_id, update.position)
            assert comparable(resumed) == want[i + 1 :], f"resume after #{i} ({kind(update)}) differs"


@pytest.mark.parametrize("variant", sorted(PLAYS))
async def test_betting_opens_with_its_deadline_and_balances_follow_the_applied_settlement(
    rig: Rig, variant: str
) -> None:
    table_id = variant.replace("_", "-")
    await PLAYS[variant](rig, table_id)
    start = await first_position(rig, table_id)
    mine = await collect(rig, BETTOR, table_id, start)
    opened = [i for i, u in enumerate(mine) if kind(u) == "round_opened"]
    assert opened
    for i in opened:
        following = [u for u in mine[i + 1 : i + 3] if kind(u) != "bet_allowance"]  # banked: the allowance first
        phase = following[0].phase_changed
        assert kind(following[0]) == "phase_changed" and phase.deadline_unix_ms > 0
        expected = "bidding" if variant == "red_envelope_bull" else "betting"
        assert phase.phase == expected
        if expected == "bidding":
            assert phase.deadline_unix_ms == mine[i].round_opened.bidding_closes_at_unix_ms
        else:
            assert phase.deadline_unix_ms == mine[i].round_opened.betting_closes_at_unix_ms
    if variant == "baibian_bull":  # the allowance is recomputed after each bet while betting is open
        bet_at = next(i for i, u in enumerate(mine) if kind(u) == "my_bet_placed")
        assert "bet_allowance" in [kind(u) for u in mine[bet_at : bet_at + 3]]
    if variant == "red_envelope_bull":
        betting = [u for u in mine if kind(u) == "phase_changed" and u.phase_changed.phase == "betting"]
        assert betting and all(u.phase_changed.deadline_unix_ms > 0 for u in betting)
    results = [i for i, u in enumerate(mine) if kind(u) == "result"]
    balances = [i for i, u in enumerate(mine) if kind(u) == "balance"]
    assert balances and all(i - 1 in results for i in balances), "a balance comes right after its round's result"
    for i in balances:
        balance = mine[i].balance
        assert balance.account == "player:p0" and balance.settlement_status in ("settled", "voided")
        assert balance.settlement_status == rig.wallet.applied[mine[i].round_id]
        assert balance.available_minor == rig.wallet.available["player:p0"]
        assert balance.net_minor == mine[i - 1].result.my_net_minor
    spectator = await collect(rig, SPECTATOR, table_id, start)
    assert [u for u in spectator if kind(u) == "result"] and not [u for u in spectator if kind(u) == "balance"]


@pytest.mark.parametrize("variant", sorted(PLAYS))
async def test_seed_revealed_carries_the_client_seed_the_round_was_played_with(rig: Rig, variant: str) -> None:
    """A client verifying from the stream alone needs the real combination of the players'
    seeds; a red-envelope round is split, never drawn, and once got an empty one here."""
    table_id = variant.replace("_", "-")
    await PLAYS[variant](rig, table_id)
    await rig.next_round(table_id, Phase.BETTING if variant != "red_envelope_bull" else Phase.BIDDING)  # the reveal
    stream = await collect(rig, BETTOR, table_id, await first_position(rig, table_id))
    (revealed,) = [u.seed_revealed for u in stream if kind(u) == "seed_revealed"]
    servicer = TableServicer(rig.app, rig.events, AuditorTokens(), None)  # type: ignore[arg-type]
    view = await servicer.GetRound(
        table_pb2.GetRoundRequest(table_id=table_id, round_id=revealed.round_id),
        None,  # type: ignore[arg-type]
    )
    assert revealed.client_seed == view.client_seed == fair.combine_client_seeds(SEEDS)
    assert list(revealed.client_seeds) == sorted(SEEDS)
    listed = {c.client_seed: (c.counted, c.mine) for c in view.client_seeds}
    withdrawn = {WITHDRAWN: (False, False)} if variant == "golden_bull" else {}
    assert listed == {SEEDS[0]: (True, False), SEEDS[1]: (True, False)} | withdrawn  # (GetRound as nobody's)
    placed = [u.my_bet_placed for u in stream if kind(u) == "my_bet_placed"]
    assert SEEDS[0] in {p.client_seed for p in placed}  # the bettor's own BetPlaced carries their contribution
    seed = bytes.fromhex(revealed.server_seed)
    if variant == "red_envelope_bull":  # the stream's grabs and seed rebuild the split
        grabs = sorted((u.envelope_grabbed for u in stream if kind(u) == "envelope_grabbed"), key=lambda g: g.grab_no)
        total, shares = view.envelope_total_minor, len(grabs)
        split = fair.split_envelope(seed, revealed.round_id, revealed.client_seed, total, shares, 1)
        assert list(split.amounts) == [g.amount_minor for g in grabs]
        assert list(split.grab_order) == [g.position for g in grabs]
        return
    if variant == "baibian_bull":  # the drawn card, then the hands round the table
        (dealt,) = [u.dealt for u in stream if kind(u) == "dealt"]
        hands = {h.seat: list(h.cards) for h in view.hands if h.group == "open"}
        cards, size = dealt_prefix(dealt.drawn_card, hands), 54
    else:
        cards, size = [card for hand in view.hands for card in hand.cards], 52
    verdict = fair.verify_round(
        revealed.commitment, seed, revealed.round_id, revealed.client_seed, size, parse_cards(cards)
    )
    assert verdict.ok, verdict


async def folded_until(rig: Rig, variant: str, round_id: str, position: int) -> RoundState:
    """The round as ``evolve`` folds its events up to ``position``, read as GetRound reads them (by round)."""
    row = await rig.app.round_row(round_id)
    config, limits = tuple(sorted(row["config"].items())), ev.TableLimits.FromString(row["limits"])
    start = RoundState(row["table_id"], round_id, variant, config, limits)
    events = [e for e in await rig.app.round_events(round_id) if e.position <= position]
    return fold_round(start, [e.unpack(EVENT_TYPES[e.event_type]()) for e in events if e.event_type in EVENT_TYPES])


@pytest.mark.parametrize("variant", sorted(PLAYS))
async def test_the_watch_folds_the_read_model_get_round_answers_from(rig: Rig, variant: str) -> None:
    """One read model: after every event of the round in play, the watcher's state is the RoundState
    ``evolve`` folds from that round's events so far, the area totals sent are its view's, and it holds
    only the hands and grabs the watcher was sent; at the end it is the state GetRound answers from."""
    table_id = variant.replace("_", "-")
    await PLAYS[variant](rig, table_id)
    await rig.next_round(table_id, Phase.BETTING if variant != "red_envelope_bull" else Phase.BIDDING)
    table, _ = await rig.app.get_table(table_id)
    state = watch.WatchState(BETTOR, table)
    revealed: list[table_pb2.TableUpdate] = []
    checked = 0
    for event in await watch.read_table_events(rig.pool, table_id, 0, watch.READ_BATCH):
        sent = state.updates(event)
        if state.round is None or event.envelope.correlation_id != state.round.round_id:
            continue
        assert state.round == await folded_until(rig, variant, state.round.round_id, event.position)
        view = round_view(state.round, "player:p0", privileged=True)
        live = [b for b in view.my_bets if b.outcome != "cancelled"]
        for totals in (u.area_totals for u in sent if kind(u) == "area_totals"):
            assert {area: minor for area, minor in totals.totals_minor.items() if minor} == view.area_totals_minor
            assert totals.bets == len(live)
        revealed = [] if event.event_type == "table.round_opened" else revealed
        revealed += [u for u in sent if kind(u) in ("hand_revealed", "envelope_grabbed")]
        assert [u.hand_revealed for u in revealed if kind(u) == "hand_revealed"] == list(state.round.hands)
        assert [u.envelope_grabbed for u in revealed if kind(u) == "envelope_grabbed"] == list(state.round.grabs)
        checked += 1
    assert checked > 10 and state.round is not None
    current = await rig.app.round_row(state.round.round_id)
    assert [state.round] == await rig.app.round_states(variant, [current])


async def test_an_earlier_rounds_event_leaves_the_allowance_of_the_round_in_play(rig: Rig) -> None:
    """An event of an earlier round read mid-round (an operator's void of a settled round) is relayed,
    and the allowance stays the round in play's: each of the watcher's stakes is counted once."""
    await play_baibian(rig, "bv")
    earlier = (await rig.current("bv"))["round_id"]
    await rig.next_round("bv")
    await rig.app.place_bet(BETTOR, "v1", "bv", "heaven", 1_000)
    machine = rig.app.machine_for(variant_of("baibian_bull"))
    assert await machine.void_rejected("bv", earlier, "REPAIRED: a test") is not None
    await rig.app.place_bet(BETTOR, "v2", "bv", "earth", 2_000)
    updates = await collect(rig, BETTOR, "bv", 0)
    assert [u.round_id for u in updates if kind(u) == "result"] == [earlier]
    allowances = [u.bet_allowance for u in updates if kind(u) == "bet_allowance"]
    assert [(a.my_staked_minor, a.table_staked_minor) for a in allowances] == [(0, 0), (1_000, 1_000), (3_000, 3_000)]


async def test_the_balance_waits_for_the_wallet_to_apply_the_settlement(rig: Rig) -> None:
    await rig.create("gw", "golden_bull")
    await rig.to_phase("gw", Phase.BETTING)
    await rig.app.place_bet(BETTOR, "b1", "gw", "area_1", 1_000)
    current = await rig.current("gw")
    await rig.advance("gw", lambda r: r["phase"] in Phase.ENDED)  # steps deliver: undo that for this round
    rig.wallet.applied.pop(current["round_id"], None)
    table, _ = await rig.app.get_table("gw")
    stream = watch.watch_table(rig.app.ctx, None, BETTOR, table, await first_position(rig, "gw"))
    seen: list[table_pb2.TableUpdate] = []
    async for update in stream:
        seen.append(update)
        if kind(update) == "result":
            break
    # The wallet has not applied it: only heartbeats (at the result's position) until it has.
    beat = await anext(stream)
    assert kind(beat) == "heartbeat" and beat.position == seen[-1].position
    rig.wallet.applied[current["round_id"]] = "settled"
    balance = await anext(stream)
    while kind(balance) == "heartbeat":
        balance = await anext(stream)
    await stream.aclose()
    assert kind(balance) == "balance" and balance.balance.settlement_status == "settled"
    assert balance.position > seen[-1].position


async def test_unknown_and_expired_positions_are_out_of_range_at_once(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    await play_golden_bull(rig, "gx")
    await rig.create("other", "golden_bull")
    await rig.to_phase("other", Phase.BETTING)
    everything = await collect(rig, BETTOR, "gx", await first_position(rig, "gx"))
    foreign = await collect(rig, BETTOR, "other", 0)
    table, _ = await rig.app.get_table("gx")
    for after, reason in [
        (everything[-1].position + 1_000 * watch.SLOTS, "POSITION_UNKNOWN"),  # in the future
        (-1, "POSITION_UNKNOWN"),
        (foreign[0].position, "POSITION_UNKNOWN"),  # another table's
    ]:
        stream = watch.watch_table(rig.app.ctx, None, BETTOR, table, after)
        with pytest.raises(watch.OutOfRange, match=reason):
            await anext(stream)
    await rig.next_round("gx")
    monkeypatch.setattr(watch, "RESUME_ROUNDS", 1)  # only the current round can be resumed in
    stream = watch.watch_table(rig.app.ctx, None, BETTOR, table, everything[0].position)
    with pytest.raises(watch.OutOfRange, match="POSITION_TOO_OLD"):
        await anext(stream)
    now = await collect(rig, BETTOR, "gx", 0)
    assert now and kind(now[0]) == "round_opened"
    assert await collect(rig, BETTOR, "gx", now[0].position) == now[1:]


async def test_heartbeats_repeat_the_last_position_and_carry_the_server_clock(rig: Rig) -> None:
    await rig.create("gh", "golden_bull")
    await rig.to_phase("gh", Phase.BETTING)
    table, _ = await rig.app.get_table("gh")
    stream = watch.watch_table(rig.app.ctx, None, SPECTATOR, table, 0)
    first = await anext(stream)
    second = await anext(stream)
    beats = [await anext(stream) for _ in range(2)]
    await stream.aclose()
    assert (kind(first), kind(second)) == ("round_opened", "phase_changed")
    assert all(kind(b) == "heartbeat" and b.position == second.position for b in beats)
    assert all(b.server_time_unix_ms == unix_ms(rig.clock()) for b in beats)


async def test_get_round_lists_golden_bull_hands_in_deal_order(rig: Rig) -> None:
    await rig.create("gd", "golden_bull")
    current = await rig.to_phase("gd", Phase.BETTING)
    await rig.finish("gd")
    servicer = TableServicer(rig.app, rig.events, AuditorTokens(), None)  # type: ignore[arg-type]
    view = await servicer.GetRound(
        table_pb2.GetRoundRequest(table_id="gd", round_id=current["round_id"]),
        None,  # type: ignore[arg-type]
    )
    assert [h.seat for h in view.hands] == ["dealer", "area_1", "area_2", "area_3"]
    deck = fair.shuffle(rig.rng.seed(current["round_id"]), current["round_id"], "", 52)
    dealt = [card for hand in view.hands for card in hand.cards]
    assert dealt == [str(card) for card in deck[:20]]  # niuniu-verify --dealt takes them in this order
