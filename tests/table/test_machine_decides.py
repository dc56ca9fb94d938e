"""The live round machines save exactly what ``decide`` returns: load -> decide -> save.

Rounds of every shape are played on PostgreSQL (the real TableApp and store, fake rng and wallet, a
fake clock: ``table_rig.py``) with the pure core's ``decide`` and the machines' ``save`` watched.
Every list of events a step saves is one ``decide`` returned for that round (from the state the
step loaded), and a round's events on the table's stream (its opening, its bids and its seed reveal
aside) are the wire events of those lists, in order: no phase of a round is announced by anything
but ``decide``. The rounds include a deal the rng first fails, jackpot side bets, a banker's round,
a red-envelope round nobody bids in and one the envelope's split voids (re-dealt).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from google.protobuf.message import Message
from psycopg_pool import AsyncConnectionPool

from bull.money import JACKPOT_POOL
from services.table import round_base
from services.table.core.commands import Command
from services.table.core.decide import decide as real_decide
from services.table.core.evolve import EVENT_TYPES, Event
from services.table.core.state import RoundState
from services.table.round_base import RoundMachine
from services.table.store import Conn
from tests.table.table_rig import Rig, player, setup_schema

pytestmark = pytest.mark.integration

BALANCES = {f"player:p{i}": 10_000_000 for i in range(6)} | {"house": 0, JACKPOT_POOL: 50_000}
Watched = list[tuple[str, list[Event]]]
NOT_STEPS = ("table.round_opened", "table.bid_placed", "table.seed_revealed")
"""The round's events on the table's stream that no step of its machine appends: the opening, the players'
bids (``envelope_commands.py``), the seed revealed after the round."""


@pytest.fixture
async def rig(pool: AsyncConnectionPool) -> Rig:
    return Rig(pool, await setup_schema(pool), BALANCES)


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> tuple[Watched, Watched]:
    """(what ``decide`` returned, what the machines saved), each with its round id, in call order."""
    decided: Watched = []
    saved: Watched = []
    real_save = RoundMachine.save

    def decide(state: RoundState, command: Command, now_ms: int) -> list[Event]:
        events = real_decide(state, command, now_ms)
        decided.append((state.round_id, list(events)))
        return events

    async def save(self: RoundMachine, conn: Conn, state: RoundState, events: Sequence[Event]) -> None:
        saved.append((state.round_id, list(events)))
        await real_save(self, conn, state, events)

    monkeypatch.setattr(round_base, "decide", decide)
    monkeypatch.setattr(RoundMachine, "save", save)
    return decided, saved


async def assert_saved_what_decide_returned(rig: Rig, table_id: str, watched: tuple[Watched, Watched]) -> list[str]:
    """The table's rounds hold exactly the events ``decide`` returned and the machines saved; the rounds'
    last events' types."""
    decided, saved = watched
    endings = []
    for row in await rig.app.recent_rounds(table_id, 100):
        round_id = row["round_id"]
        outputs = [events for r, events in decided if r == round_id]
        steps = [events for r, events in saved if r == round_id and events]
        assert steps, f"{round_id}: no step saved anything"
        assert all(events in outputs for events in steps), f"{round_id}: a step saved what decide did not return"
        stored = [
            e.unpack(EVENT_TYPES[e.event_type]())
            for e in await rig.app.round_events(round_id)
            if e.stream_id == f"table-{table_id}" and e.event_type not in NOT_STEPS
        ]
        assert stored == [e for events in steps for e in events if isinstance(e, Message)], round_id
        endings.append(type(stored[-1]).__name__)
    return sorted(endings)


async def test_card_rounds_append_what_decide_returns(rig: Rig, watched: tuple[Watched, Watched]) -> None:
    await rig.create("dg", "golden_bull")
    await rig.create("db", "bai_buu", {"jackpot.stake_minor": "100"})
    bets = {"dg": (("area_1", 1_000), ("area_2", 2_000)), "db": (("player_01", 1_000), ("jackpot_player_01", 100))}
    for table_id, stakes in bets.items():
        for n in range(2):
            await rig.to_phase(table_id, "betting")
            for i, (area, stake) in enumerate(stakes):
                await rig.app.place_bet(player(f"p{i}"), f"{table_id}-{n}-{i}", table_id, area, stake)
            rig.rng.failures = n  # the second round's first draw fails: the next step deals
            await rig.finish(table_id)
        assert await assert_saved_what_decide_returned(rig, table_id, watched) == ["RoundSettled"] * 2


async def test_banker_and_envelope_rounds_append_what_decide_returns(
    rig: Rig, watched: tuple[Watched, Watched]
) -> None:
    await rig.create("dbb", "baibian_bull", {"banker.min_capital_minor": "100000"})
    await rig.app.banker.apply(player("p5"), "dbb", 1_000_000)
    await rig.next_round("dbb")
    await rig.app.place_bet(player("p0"), "dbb-0", "dbb", "heaven", 1_000)
    await rig.finish("dbb")
    assert "RoundSettled" in await assert_saved_what_decide_returned(rig, "dbb", watched)

    await rig.create("dr", "red_envelope_bull", {"bidding.seconds": "5"})
    await rig.to_phase("dr", "bidding")
    await rig.finish("dr")  # nobody bids: voided
    for n, bad_split in enumerate((False, True)):
        current: dict[str, Any] = await rig.next_round("dr", "bidding")
        await rig.app.envelope.place_bid(player("p0"), f"bid-{n}", "dr", 10_000)
        await rig.to_phase("dr", "betting")
        for i in (2, 3):
            await rig.app.place_bet(player(f"p{i}"), f"dr-{n}-{i}", "dr", "dealer", 1_000)
        if bad_split:  # not one share each: an envelope error, re-dealt
            rig.rng.forced_splits[current["round_id"]] = ([1, 999], [0, 1])
        await rig.finish("dr")
    endings = await assert_saved_what_decide_returned(rig, "dr", watched)
    assert endings == ["RoundSettled", "RoundVoided", "RoundVoided"]
