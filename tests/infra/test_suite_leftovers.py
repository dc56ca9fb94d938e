"""The suite's schemas are recognised by name and dropped at the end of the last session (tests/conftest.py):
the end-to-end stacks' and the ``schema`` fixture's, never a load run's, a chaos run's or anything else."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from tests.harness import SUITE_SCHEMAS, drop_schemas

pytestmark = pytest.mark.integration


def test_the_suites_schemas_are_told_apart_and_dropped_with_their_tables(dsn: str, unique: str) -> None:
    suite = [f"e2e_{unique}_table", f"e2e_health-{unique}_wallet", f"t_{unique}"]
    others = [f"load_{unique}_table", f"chaos_{unique}_rng", f"t_{unique}0", f"x_e2e_{unique}"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in suite + others:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE TABLE {}.events (position BIGINT PRIMARY KEY)").format(sql.Identifier(name)))
        try:
            cur = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname ~ %s AND nspname LIKE %s ORDER BY nspname",
                (SUITE_SCHEMAS, f"%{unique}%"),
            )
            assert [row[0] for row in cur.fetchall()] == sorted(suite)
            # Only this test's own: another session's stacks may be running on this database.
            mine = "^(" + "|".join(name.replace("-", "\\-") for name in suite) + ")$"
            assert drop_schemas(dsn, mine) == sorted(suite)
            cur = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s ORDER BY nspname", (f"%{unique}%",)
            )
            assert [row[0] for row in cur.fetchall()] == sorted(others)
        finally:
            for name in suite + others:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
