"""The audit's reads of a whole journal on the real PostgreSQL: every entry in order (``queries.iter_entries``)
and each listed account's balances as of its wallet page's position."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg import sql

from backbone.db import run_ddl
from services.ledger import audit_replay, queries
from services.ledger.journal import Line
from services.ledger.projection import DDL
from services.ledger.reconcile import WalletBalance

pytestmark = pytest.mark.integration

# Ids whose code-point order differs from a linguistic one ("B" < "a" < "b" by code point), and
# enough of them that the reads cross their cursors' fetches (ITER_CHUNK_ENTRIES is made 3 below).
IDS = ["b-2", "B-1", "a-10", "a-9", "a-1", "é", "z", "A"]


async def _journal(conn: psycopg.AsyncConnection, entry_ids: list[str]) -> None:
    at = datetime(2026, 12, 4, tzinfo=UTC)
    for n, entry_id in enumerate(entry_ids):
        await conn.execute(
            "INSERT INTO journal_entries (entry_id, event_id, movement_index, event_type, kind, round_id, hold_id,"
            ' bet_id, occurred_at, topic, partition, "offset", wallet_position)'
            " VALUES (%s, %s, 0, 'wallet.hold_placed', 'hold', '', '', '', %s, 't', 0, %s, %s)",
            (entry_id, uuid.uuid4(), at, n, n + 1),
        )
        for line_no in range(n % 3 + 1):  # one to three lines
            await conn.execute(
                "INSERT INTO journal_lines (entry_id, line_no, account, bucket, debit_minor, credit_minor)"
                " VALUES (%s, %s, %s, 'available', %s, 0)",
                (entry_id, line_no, f"player:{entry_id}:{line_no}", 10 * n + line_no + 1),
            )


async def test_every_entry_comes_once_with_its_own_lines_in_code_point_order(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queries, "ITER_CHUNK_ENTRIES", 3)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
        await run_ddl(conn, DDL)
        await _journal(conn, IDS)
        # A line whose entry the entries' read did not see (committed between the two reads' openings):
        # the foreign key is taken off to make one.
        await conn.execute("ALTER TABLE journal_lines DROP CONSTRAINT journal_lines_entry_id_fkey")
        await conn.execute(
            "INSERT INTO journal_lines (entry_id, line_no, account, bucket, debit_minor, credit_minor)"
            " VALUES ('a-0', 0, 'player:late', 'held', 1, 0)"
        )

        read = [entry async for entry in queries.iter_entries(conn)]

    assert [e.entry_id for e in read] == sorted(IDS)  # Python's str order is code-point order
    for entry in read:
        n = IDS.index(entry.entry_id)
        assert entry.wallet_position == n + 1
        assert entry.lines == tuple(
            Line(f"player:{entry.entry_id}:{no}", "available", 10 * n + no + 1, 0) for no in range(n % 3 + 1)
        )
    assert all(line.account != "player:late" for entry in read for line in entry.lines)


async def test_each_listed_account_is_summed_as_of_its_own_pages_position(dsn: str, schema: str) -> None:
    """The same balances as a trial balance as of each page's position, read once for all pages."""
    accounts = [f"player:p{n}" for n in range(6)]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
        await run_ddl(conn, DDL)
        await _journal(conn, [f"e-{n:02d}" for n in range(30)])  # wallet positions 1..30
        for n in range(30):  # and a transfer in each entry between two of the six accounts
            for line_no, account, debit, credit in ((9, n % 6, n + 1, 0), (10, (n + 1) % 6, 0, n + 1)):
                await conn.execute(
                    "INSERT INTO journal_lines (entry_id, line_no, account, bucket, debit_minor, credit_minor)"
                    " VALUES (%s, %s, %s, 'available', %s, %s)",
                    (f"e-{n:02d}", line_no, accounts[account], debit, credit),
                )
        # Pages taken at positions 5, 12 and 30, two accounts each, and one account listed without a position.
        positions = [5, 12, 30]
        listed = {account: WalletBalance(0, 0, positions[n % 3]) for n, account in enumerate(accounts)}
        listed["player:unpositioned"] = WalletBalance(0, 0)

        as_of = await audit_replay._replayed_as_of(conn, listed)

        assert sorted(as_of) == positions
        for position in positions:
            trial = await queries.trial_balance(conn, as_of_position=position)
            expected = {
                (row.account, row.bucket): row.balance_minor
                for row in trial.rows
                if listed.get(row.account, WalletBalance(0, 0)).as_of_position == position
            }
            assert len(expected) == 2 and as_of[position] == expected
        now = await queries.trial_balance(conn, from_lines=True)
        current = {(row.account, row.bucket): row.balance_minor for row in now.rows}
        assert as_of[5][accounts[0], "available"] != current[accounts[0], "available"]  # the cut matters
