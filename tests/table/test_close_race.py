"""CloseTable racing the round in play for the table's stream: the close is tried again, never an error.

The round appends to the table's stream under the round's lock, CloseTable under the table's, so
CloseTable can read the stream's version just before the round appends. Its own append then loses
(ConcurrencyError: nothing written); it must read again and close the table. Before, the error
reached the admin as INTERNAL and the table went on playing (a CI chaos run's drain).
"""

from __future__ import annotations

import asyncio

import pytest
from niuniu.table.v1 import events_pb2 as ev
from psycopg_pool import AsyncConnectionPool

from backbone.eventstore import NewEvent
from services.table.common import table_stream
from tests.table.table_rig import ADMIN, Rig, setup_schema

pytestmark = pytest.mark.integration

TABLE = "t-close-race"


async def test_a_close_that_loses_the_race_for_the_table_stream_reads_again_and_closes(
    pool: AsyncConnectionPool,
) -> None:
    rig = Rig(pool, await setup_schema(pool), {})
    await rig.create(TABLE, "golden_bull")
    stream = table_stream(TABLE)
    marker = NewEvent("table.race_marker", ev.TableClosing(table_id=TABLE), correlation_id=TABLE)
    async with pool.connection() as other, other.transaction():  # "the round", appending under its own lock
        version = await rig.events.stream_version(other, stream)
        await rig.events.append(other, stream, version, [marker])
        closing = asyncio.create_task(rig.app.close_table(ADMIN, TABLE))
        await asyncio.sleep(0.5)  # the close has read the old version and waits for the stream's ordering lock
        assert not closing.done(), closing.exception() if closing.done() else None
    table = await asyncio.wait_for(closing, 10)  # the round committed first: the close lost, then went again
    assert table["closing_at"] is not None
    async with pool.connection() as conn:
        types = [e.event_type for e in await rig.events.read_stream(conn, stream)]
    assert types[-2:] == ["table.race_marker", "table.closing"], types
