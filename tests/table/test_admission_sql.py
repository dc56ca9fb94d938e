"""The recording statement's guard (``TableStore.record_bet``) and ``admission.verify_bet`` agree.

On the real PostgreSQL, Hypothesis sets a round and the player's bets in it to random facts
(phase, deadline, the player's open and cancelled bets, the other players' bets, the round's
count of its bets) and records one bet under random bounds: the statement inserts the bet
exactly when ``verify_bet`` takes it on the facts the statement returns, and those facts are
the ones set. Each example runs in a transaction rolled back after it.
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg_pool import AsyncConnectionPool

from services.table.admission import BETTING, Bounds, Order, verify_bet
from services.table.bets import facts_recorded
from services.table.common import bet_stream
from services.table.recording import Recording
from tests.table.table_rig import Rig, setup_schema

PLAYER = "player:p"
ENVELOPE_AREA = "dealer"  # the one area a round takes one open bet of a player on (a unique index)
_ids = itertools.count()


@pytest.fixture
async def rig(pool: AsyncConnectionPool) -> Rig:
    rig = Rig(pool, await setup_schema(pool), {PLAYER: 1_000_000, "house": 0})
    await rig.create("gb", "golden_bull", betting_seconds=10)
    await rig.to_phase("gb", BETTING)
    return rig


state = st.fixed_dictionaries(
    {
        "phase": st.sampled_from([BETTING, BETTING, BETTING, "dealing"]),
        "closes_in_s": st.sampled_from([-1, 0, 1, 2, 3]),
        "one_bet": st.booleans(),
        "open_stakes": st.lists(st.integers(min_value=1, max_value=1_500), max_size=3),
        "cancelled": st.integers(min_value=0, max_value=2),
        "others": st.integers(min_value=0, max_value=3),
        "counted": st.booleans(),  # the round's count kept, or counted from its bets
        # The bounds as offsets from the facts, so that every boundary is met (one under, at, one over).
        "room": st.integers(min_value=-1, max_value=1),
        "round_room": st.integers(min_value=-1, max_value=1),
        "player_room": st.integers(min_value=-1, max_value=1),
        "amount": st.integers(min_value=1, max_value=2_000),
    }
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state)
async def test_the_statement_records_a_bet_exactly_when_verify_bet_takes_it_on_the_facts_it_returns(
    rig: Rig, state: dict[str, Any]
) -> None:
    current = await rig.current("gb")
    round_id, now = current["round_id"], rig.clock()
    area = ENVELOPE_AREA if state["one_bet"] else "area_1"
    open_stakes = state["open_stakes"][:1] if state["one_bet"] else state["open_stakes"]
    n = next(_ids)
    prior = [(PLAYER, area, s, "placed") for s in open_stakes] + [(PLAYER, area, 100, "cancelled")] * state["cancelled"]
    prior += [(f"player:o{i}", "area_1", 100, "placed") for i in range(state["others"])]
    async with rig.pool.connection() as conn, conn.transaction(force_rollback=True):
        await conn.execute(
            "UPDATE rounds SET phase = %s, betting_closes_at = %s WHERE round_id = %s",
            (state["phase"], now + timedelta(seconds=state["closes_in_s"]), round_id),
        )
        for i, (who, on, stake, status) in enumerate(prior):
            await conn.execute(
                "INSERT INTO bets (bet_id, round_id, table_id, player, area, stake_minor, hold_minor, hold_id,"
                " status, placed_at) VALUES (%s, %s, 'gb', %s, %s, %s, %s, %s, %s, %s)",
                (f"b{n}.{i}", round_id, who, on, stake, stake, f"h{n}.{i}", status, now),
            )
        await conn.execute("DELETE FROM round_bet_counts WHERE round_id = %s", (round_id,))
        if state["counted"] and prior:
            await conn.execute("INSERT INTO round_bet_counts VALUES (%s, %s)", (round_id, len(prior)))
        bet = {
            "bet_id": f"new{n}",
            "round_id": round_id,
            "table_id": "gb",
            "player": PLAYER,
            "area": area,
            "stake_minor": state["amount"],
            "hold_minor": state["amount"],
            "hold_id": f"hnew{n}",
        }
        bounds = Bounds(
            max(1, sum(open_stakes) + state["amount"] + state["room"]),
            max(1, len(prior) + state["round_room"]),
            max(1, len(open_stakes) + state["cancelled"] + state["player_room"]),
        )
        await rig.app.store.lock_for_recording(conn, [round_id], bet_stream("gb", bet["bet_id"]))
        append = rig.app.bets.groups.append_placed(bet)
        limits = (bounds.max_staked_minor, bounds.max_round_bets, bounds.max_player_bets)
        cursor = await rig.app.store.record_bet(conn, bet, now, "", append, *limits)
        recorded = await rig.app.store.bet_recorded(cursor)
        facts = facts_recorded(recorded, Recording(bet, now, "", bounds), OneBet(state["one_bet"]))  # type: ignore[arg-type]

    assert (facts.staked_minor, facts.player_bets, facts.player_open_bets, facts.round_bets) == (
        sum(open_stakes),
        len(open_stakes) + state["cancelled"],
        len(open_stakes),
        len(prior),
    )
    refusal = verify_bet(facts, Order(state["amount"]))
    assert recorded.inserted == (refusal is None), (state, facts, refusal)


class OneBet:
    """The one capability ``facts_recorded`` reads of a round shape."""

    def __init__(self, one_bet_per_round: bool) -> None:
        self.one_bet_per_round = one_bet_per_round
