"""The live consumers' staging tables: each batch stages its own rows only, and they do not pile up.

Real PostgreSQL: one connection writes many batches in turn, as a pooled connection of the
ledger's consumers does.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import psycopg
import pytest

from backbone.consumer import ExactlyOnceConsumer
from backbone.db import open_pool, run_ddl
from backbone.eventstore import build_envelope
from backbone.handlers import Tracked
from services.ledger import projection
from services.ledger.projection import DDL, apply_batch
from services.ledger.synthetic import deposited

pytestmark = pytest.mark.integration

STAGE_TABLES = ("replay_fresh", "stage_entries", "stage_lines", "stage_rounds", "stage_round_bets")
PER_BATCH = 20
TRUNCATE_AFTER = 200  # events: every tenth batch of a connection starts with a TRUNCATE


def deposit(n: int) -> Tracked:
    envelope = build_envelope(
        event_id=str(uuid.uuid4()),
        stream_id=f"account.player:{n}",
        version=1,
        event=deposited(f"player:{n}", 100 + n, f"dep-{n}"),
        occurred_at=datetime(2026, 12, 2, tzinfo=UTC),
        producer="wallet",
        store_position=n + 1,
    )
    return Tracked(envelope, "wallet.events", 0, n)


async def staged_rows(conn: psycopg.AsyncConnection) -> int:
    counts = [await (await conn.execute(f"SELECT count(*) FROM {t}")).fetchone() for t in STAGE_TABLES]
    return sum(int(c[0]) for c in counts if c is not None)


async def stage_size(conn: psycopg.AsyncConnection) -> int:
    row = await (await conn.execute("SELECT pg_relation_size('stage_lines')")).fetchone()
    assert row is not None
    return int(row[0])


async def test_batches_on_one_connection_stage_only_their_own_rows_and_what_they_leave_is_given_back(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(projection, "LIVE_STAGE_TRUNCATE_AFTER", TRUNCATE_AFTER)
    pool = await open_pool(dsn, schema=schema, min_size=1, max_size=1)  # one session: its temporary tables
    try:
        async with pool.connection() as conn:
            await ExactlyOnceConsumer.setup(conn)
            await run_ddl(conn, DDL)
        cycle = TRUNCATE_AFTER // PER_BATCH
        batches = 2 * cycle + 1
        sizes = []
        for b in range(batches):
            async with pool.connection() as conn:
                async with conn.transaction():
                    await apply_batch(conn, [deposit(PER_BATCH * b + i) for i in range(PER_BATCH)])
                # Only this batch's rows are staged: a fresh index, an entry and two lines for each event.
                assert await staged_rows(conn) == 4 * PER_BATCH
                sizes.append(await stage_size(conn))
        async with pool.connection() as conn:
            journaled = await conn.execute("SELECT count(*), count(DISTINCT entry_id) FROM journal_entries")
            entries = await journaled.fetchone()
            rejects = await (await conn.execute("SELECT count(*) FROM journal_rejects")).fetchone()
        events = PER_BATCH * batches
        assert entries == (events, events) and rejects == (0,)  # every batch wrote its own events, once
        assert sizes[cycle] < sizes[cycle - 1] and sizes[2 * cycle] < sizes[2 * cycle - 1]  # given back
        assert max(sizes) == max(sizes[: cycle + 1])  # and so what deleted rows take does not grow
    finally:
        await pool.close()
