"""The plans PostgreSQL caches for the hot lookups on tables that grow with every bet.

psycopg prepares a statement a connection runs often, and PostgreSQL then keeps one generic plan for
it until something invalidates it (an ANALYZE of a table it reads). A service starts on new tables:
never analyzed, so the planner takes each to be ten pages, and a lookup of a few keys by ``= ANY``
costs more through its index than reading those ten pages. That plan stays while the table grows,
until autovacuum first analyzes it (``autovacuum_naptime``, a minute by default, or more): every
PlaceBet read every bet and every PlaceHold every hold, and each relay poll the whole outbox.
A 20-second load on new schemas read 10.2 million bet rows for 6 291 bets.

Each test builds a service's tables as the service does, on a new schema, and asks PostgreSQL for
the generic plan of the statement the code sends (``plan_cache_mode = force_generic_plan``): it must
reach the growing table through an index.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import psycopg
import pytest
from psycopg import sql

from backbone.db import run_ddl
from backbone.eventstore import EventStore
from backbone.relay import FIRST_UNPUBLISHED, OWNED, PENDING
from services.table.schema import DDL as TABLE_DDL
from services.table.store import BETS_BY_ID
from services.wallet import repo as wallet_repo
from services.wallet.repo_holds import HOLDS_BY_ID, LOCK_HOLDS_BY_ID

pytestmark = pytest.mark.integration

Setup = Callable[[psycopg.AsyncConnection], Awaitable[None]]


async def table_setup(conn: psycopg.AsyncConnection) -> None:
    """The table's tables in the test's schema (a service's database gets them from niuniu-migrate)."""
    await run_ddl(conn, TABLE_DDL)


def _positional(statement: str) -> str:
    """psycopg's placeholders as PostgreSQL's ($1, $2, ...), for PREPARE."""
    numbers = iter(range(1, 100))
    return re.sub(r"%(\(\w+\))?[sb]", lambda _: f"${next(numbers)}", statement)


async def _generic_plan(dsn: str, schema: str, setup: Setup, statement: str, types: list[str], args: str) -> str:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
        await EventStore("test", "test.events").setup(conn)
        await setup(conn)
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        signature = f"({', '.join(types)})" if types else ""
        await conn.execute(f"PREPARE hot{signature} AS {_positional(statement)}")
        rows = await (await conn.execute(f"EXPLAIN EXECUTE hot{args}")).fetchall()
    return "\n".join(r[0] for r in rows)


async def _table_only(conn: psycopg.AsyncConnection) -> None:
    """The event store's tables alone (the relay's statements read nothing else)."""


HOT = [
    pytest.param(table_setup, BETS_BY_ID, ["text[]"], "('{a,b}')", "bets", id="table: PlaceBet's bets by id"),
    pytest.param(wallet_repo.setup, HOLDS_BY_ID, ["text[]"], "('{a,b}')", "wallet_holds", id="wallet: holds by id"),
    pytest.param(
        wallet_repo.setup, LOCK_HOLDS_BY_ID, ["text[]"], "('{a,b}')", "wallet_holds", id="wallet: holds locked"
    ),
    pytest.param(_table_only, FIRST_UNPUBLISHED.format(owned=""), [], "", "outbox", id="relay: its probe"),
    pytest.param(
        _table_only,
        FIRST_UNPUBLISHED.format(owned=OWNED),
        ["text[]", "int[]", "int[]"],
        "('{a}', '{3}', '{0}')",
        "outbox",
        id="relay: its probe of its partitions",
    ),
    pytest.param(_table_only, PENDING, [], "", "events", id="relay: the backlog's age"),
]


@pytest.mark.parametrize(("setup", "statement", "types", "args", "table"), HOT)
async def test_a_hot_lookup_reaches_a_new_table_through_its_index(
    dsn: str, schema: str, setup: Setup, statement: str, types: list[str], args: str, table: str
) -> None:
    plan = await _generic_plan(dsn, schema, setup, statement, types, args)
    assert f"Seq Scan on {table}" not in plan, plan
    assert "Index" in plan, plan


NAIVE = [
    pytest.param(
        table_setup, "SELECT * FROM bets WHERE bet_id = ANY(%b::text[])", ["text[]"], "('{a,b}')", "bets", id="bets"
    ),
    pytest.param(
        wallet_repo.setup,
        "SELECT * FROM wallet_holds WHERE hold_id = ANY(%b::text[])",
        ["text[]"],
        "('{a,b}')",
        "wallet_holds",
        id="holds",
    ),
    pytest.param(
        _table_only,
        "SELECT EXISTS (SELECT FROM outbox WHERE published_at IS NULL)",
        [],
        "",
        "outbox",
        id="relay probe",
    ),
    pytest.param(
        _table_only,
        "SELECT min(e.occurred_at) FROM outbox o JOIN events e USING (position) WHERE o.published_at IS NULL",
        [],
        "",
        "events",
        id="backlog age",
    ),
]


@pytest.mark.parametrize(("setup", "statement", "types", "args", "table"), NAIVE)
async def test_the_forms_they_replace_read_the_whole_new_table(
    dsn: str, schema: str, setup: Setup, statement: str, types: list[str], args: str, table: str
) -> None:
    """The premise of the test above, on this PostgreSQL: the obvious forms plan a scan of the table."""
    plan = await _generic_plan(dsn, schema, setup, statement, types, args)
    assert f"Seq Scan on {table}" in plan, plan
