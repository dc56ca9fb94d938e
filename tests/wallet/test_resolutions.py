"""A settlement's hold resolutions are written in one statement: each hold its own fields, and a hold
that is no longer open refuses the whole write (a second resolution is impossible)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from services.wallet import repo
from services.wallet.domain import AccountKind, Hold, HoldRequest, HoldStatus

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def open_hold(n: int) -> Hold:
    request = HoldRequest(f"bet.h{n}", "player:p", 100 * n, "bet", "round-1", 0)
    return Hold(request, NOW + timedelta(minutes=5), NOW)


async def test_resolutions_keep_each_holds_fields_and_a_hold_not_open_refuses_them_all(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute(f'SET search_path TO "{schema}"')
        await repo.setup(conn)
        await repo.insert_account(conn, "player:p", AccountKind.PLAYER)
        holds = [open_hold(n) for n in (1, 2, 3)]
        await repo.insert_holds(conn, holds)
        resolved = [
            replace(
                holds[0],
                status=HoldStatus.POSTED,
                posted_minor=100,
                resolved_at=NOW,
                resolved_by="settlement",
                postings=(("house", 100),),
            ),
            replace(
                holds[1],
                status=HoldStatus.POSTED,
                posted_minor=150,
                released_minor=50,
                resolved_at=NOW,
                resolved_by="settlement",
                postings=(("house", 120), ("player:q", 30)),
            ),
            replace(
                holds[2],
                status=HoldStatus.VOIDED,
                released_minor=300,
                resolved_at=NOW + timedelta(seconds=1),
                resolved_by="void",
            ),
        ]
        await repo.save_resolutions(conn, resolved)
        await conn.commit()
        assert await repo.holds(conn, [h.hold_id for h in holds]) == {h.hold_id: h for h in resolved}

        # One of them again, beside one still open: nothing of the write may stay.
        fourth = open_hold(4)
        await repo.insert_holds(conn, [fourth])
        await conn.commit()
        with pytest.raises(AssertionError, match="1 of the holds were not open"):
            await repo.save_resolutions(
                conn,
                [
                    replace(fourth, status=HoldStatus.VOIDED, resolved_by="void"),
                    replace(resolved[0], resolved_by="again"),
                ],
            )
        await conn.rollback()
        after = await repo.holds(conn, [fourth.hold_id, resolved[0].hold_id])
        assert after == {fourth.hold_id: fourth, resolved[0].hold_id: resolved[0]}
