"""A table's whole record folded with ``evolve`` finds the rounds GetRound answers.

Rounds of every shape are played on PostgreSQL (the real TableApp and store, fake rng and
wallet, a fake clock: ``table_rig.py``); then every event of the table (its stream, its bets'
streams, its banker stream) is read back in position order and folded by
``services.table.core.evolve.fold_table`` from the table's TableCreated on. Each round the fold
finds must be the RoundView the servicer answers for it (GetRound folds the round's own events
from its row), and the fold must find every round the table has.
"""

from __future__ import annotations

import pytest
from google.protobuf.message import Message
from niuniu.table.v1 import table_pb2
from psycopg_pool import AsyncConnectionPool

from bull.money import JACKPOT_POOL
from services.table.api import TableServicer
from services.table.core.evolve import EVENT_TYPES, fold_table
from services.table.core.view import round_view
from tests.table.table_rig import AuditorTokens, Rig, player, setup_schema

BALANCES = {f"player:p{i}": 10_000_000 for i in range(6)} | {"house": 0, JACKPOT_POOL: 50_000}


@pytest.fixture
async def rig(pool: AsyncConnectionPool) -> Rig:
    return Rig(pool, await setup_schema(pool), BALANCES)


async def table_record(rig: Rig, table_id: str) -> list[Message]:
    """Every event of the table's streams, in position order, as its payload."""
    stream = f"table-{table_id}"
    out: list[Message] = []
    async with rig.pool.connection() as conn:
        stored = await rig.events.read_all(conn, 0, 100_000)
    for event in stored:
        kind = EVENT_TYPES.get(event.event_type)
        if kind is not None and (event.stream_id == stream or event.stream_id.startswith(stream + ".")):
            out.append(event.unpack(kind()))
    return out


async def assert_fold_matches(rig: Rig, table_id: str) -> int:
    """The fold's rounds are GetRound's, field for field; how many rounds were compared."""
    folded = fold_table(await table_record(rig, table_id))
    rows = await rig.app.recent_rounds(table_id, 100)
    assert sorted(folded) == sorted(r["round_id"] for r in rows)
    servicer = TableServicer(rig.app, rig.events, AuditorTokens(), None)  # type: ignore[arg-type]
    for row in rows:
        if row["phase"] in ("settled", "voided") and row["server_seed"] is None:
            await rig.app.reveal_seed(row)
            folded = fold_table(await table_record(rig, table_id))
        request = table_pb2.GetRoundRequest(table_id=table_id, round_id=row["round_id"])
        answered = await servicer.GetRound(request, None)  # type: ignore[arg-type]
        view = round_view(folded[row["round_id"]], "player:audit", privileged=True)
        differ = [
            f.name for f in table_pb2.RoundView.DESCRIPTOR.fields if getattr(view, f.name) != getattr(answered, f.name)
        ]
        assert differ == [], f"{row['round_id']}: the fold and GetRound differ in {differ}"
        assert view == answered
    return len(rows)


async def play_house_rounds(rig: Rig, table_id: str, variant: str, areas: tuple[str, ...]) -> None:
    await rig.create(table_id, variant)
    for n in range(3):
        await rig.to_phase(table_id, "betting")
        for i, area in enumerate(areas):
            await rig.app.place_bet(player(f"p{i}"), f"{table_id}-{n}-{i}", table_id, area, 1_000 * (i + 1),
                                    client_seed=f"{n:02d}{i:02d}" * 8)  # fmt: skip
        await rig.app.cancel_bet(player("p0"), table_id, f"{table_id}-{n}-0")  # by its command id
        await rig.finish(table_id)


async def test_a_golden_bull_tables_record_folds_into_getrounds_rounds(rig: Rig) -> None:
    await play_house_rounds(rig, "fg", "golden_bull", ("area_1", "area_2", "area_3"))
    assert await assert_fold_matches(rig, "fg") >= 3


async def test_a_baibian_tables_record_folds_into_getrounds_rounds(rig: Rig) -> None:
    await rig.create("fb", "baibian_bull", {"banker.min_capital_minor": "100000"})
    await rig.app.banker.apply(player("p5"), "fb", 1_000_000)
    for n in range(2):
        await rig.next_round("fb")
        for i, area in enumerate(("heaven", "earth")):
            await rig.app.place_bet(player(f"p{i}"), f"fb-{n}-{i}", "fb", area, 1_000)
        await rig.finish("fb")
    assert await assert_fold_matches(rig, "fb") >= 2


async def test_a_red_envelope_tables_record_folds_into_getrounds_rounds(rig: Rig) -> None:
    await rig.create("fr", "red_envelope_bull", {"bidding.seconds": "5"})
    for n in range(2):
        await rig.to_phase("fr", "bidding")
        await rig.app.envelope.place_bid(player("p0"), f"bid-{n}a", "fr", 10_000)
        await rig.app.envelope.place_bid(player("p1"), f"bid-{n}b", "fr", 20_000)
        await rig.to_phase("fr", "betting")
        for i in (2, 3, 4):
            await rig.app.place_bet(player(f"p{i}"), f"fr-{n}-{i}", "fr", "dealer", 1_000)
        await rig.app.envelope.change_bet(player("p3"), f"c{n}", "fr", f"fr-{n}-3", 3_000)
        await rig.finish("fr")
    await rig.next_round("fr", "bidding")
    await rig.finish("fr")  # nobody bids: voided
    assert await assert_fold_matches(rig, "fr") >= 3
