"""The wallet's writes of many rows in one statement: a settlement's hold resolutions (each hold its own
fields; a hold no longer open refuses the whole write, so a second resolution is impossible), and a
group's movements with the accounts' new stream versions."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from services.wallet import repo, repo_holds
from services.wallet.domain import AccountKind, Bucket, HoldStatus, Leg, Movement
from services.wallet.domain_holds import Hold, HoldRequest

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
        await repo_holds.insert_holds(conn, holds)
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
        await repo_holds.save_resolutions(conn, resolved)
        await conn.commit()
        assert await repo_holds.holds(conn, [h.hold_id for h in holds]) == {h.hold_id: h for h in resolved}

        # One of them again, beside one still open: nothing of the write may stay.
        fourth = open_hold(4)
        await repo_holds.insert_holds(conn, [fourth])
        await conn.commit()
        again = [
            replace(fourth, status=HoldStatus.VOIDED, resolved_by="void"),
            replace(resolved[0], resolved_by="again"),
        ]
        with pytest.raises(psycopg.errors.RaiseException, match="1 of the holds were not open"):
            await repo_holds.save_resolutions(conn, again)
        await conn.rollback()
        after = await repo_holds.holds(conn, [fourth.hold_id, resolved[0].hold_id])
        assert after == {fourth.hold_id: fourth, resolved[0].hold_id: resolved[0]}

        # The same queued in pipeline mode (as a settlement writes it), where no row count is read
        # before the pipeline syncs: the statement itself fails, and the transaction with it.
        with pytest.raises(psycopg.errors.RaiseException, match="1 of the holds were not open"):
            async with conn.pipeline():
                await repo_holds.save_resolutions(conn, again)
                await conn.execute("UPDATE wallet_holds SET reason = 'changed' WHERE hold_id = %s", (fourth.hold_id,))
        await conn.rollback()
        after = await repo_holds.holds(conn, [fourth.hold_id, resolved[0].hold_id])
        assert after == {fourth.hold_id: fourth, resolved[0].hold_id: resolved[0]}


def hold_movement(account: str, amount: int) -> Movement:
    legs = (Leg(account, Bucket.AVAILABLE, -amount), Leg(account, Bucket.HELD, amount))
    return Movement(f"m-{account}", "hold", legs, hold_id=f"h-{account}")


async def test_movements_set_the_versions_given_with_the_balances_and_only_those(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute(f'SET search_path TO "{schema}"')
        await repo.setup(conn)
        for name in ("player:a", "player:b", "player:c"):
            await repo.insert_account(conn, name, AccountKind.PLAYER)
        await conn.execute("UPDATE wallet_accounts SET available_minor = 1000, version = 4")
        # a: moved and versioned; b: versioned only; c: moved only.
        await repo.save_movements(
            conn,
            [hold_movement("player:a", 100), hold_movement("player:c", 30)],
            "hold",
            NOW,
            {"player:a": 5, "player:b": 7},
        )
        cur = await conn.execute(
            "SELECT account, available_minor, held_minor, version FROM wallet_accounts"
            " WHERE account LIKE 'player:%' ORDER BY account"
        )
        assert await cur.fetchall() == [("player:a", 900, 100, 5), ("player:b", 1000, 0, 7), ("player:c", 970, 30, 4)]
        cur = await conn.execute("SELECT account, available_delta, held_delta FROM wallet_entries ORDER BY entry_id")
        assert await cur.fetchall() == [("player:a", -100, 100), ("player:c", -30, 30)]
