"""The wallet's tables, and its accounts, movements and idempotent requests: current state next to
the event store, written in the same transaction.

Balances live in ``wallet_accounts``; every change of them is also an entry in
``wallet_entries`` (one row per movement and account) and an event with legs, so
the sum of an account's entries is its balance and the events rebuild both.
Rows are locked in account-name order, then holds, so concurrent commands queue
instead of deadlocking. The holds' queries are in repo_holds, the responsible-play
settings' in repo_play, the settlement's in repo_settlement and the users' in repo_users.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from backbone.db import run_ddl
from backbone.eventreads import last_position
from backbone.eventstore import wait_for_appends
from backbone.relay import published_below as relays_published_below
from bull.accounts import OPENING_ACCOUNTS
from services.wallet.domain import AccountKind, AccountState, Movement, net_by_account

SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS wallet_users (
        account_id     UUID PRIMARY KEY,
        username       TEXT NOT NULL UNIQUE,
        email          TEXT NOT NULL,
        password_hash  TEXT NOT NULL,
        role           TEXT NOT NULL CHECK (role IN ('player', 'admin', 'auditor', 'cashier')),
        request_id     TEXT UNIQUE,
        created_at     TIMESTAMPTZ NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS wallet_accounts (
        account          TEXT PRIMARY KEY,
        kind             TEXT NOT NULL CHECK (kind IN ('player', 'system', 'external')),
        available_minor  BIGINT NOT NULL DEFAULT 0,
        held_minor       BIGINT NOT NULL DEFAULT 0 CHECK (held_minor >= 0),
        version          BIGINT NOT NULL DEFAULT 0,
        CHECK (kind <> 'player' OR available_minor >= 0)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS wallet_holds (
        seq                      BIGSERIAL UNIQUE,
        hold_id                  TEXT PRIMARY KEY,
        account                  TEXT NOT NULL REFERENCES wallet_accounts (account),
        amount_minor             BIGINT NOT NULL CHECK (amount_minor > 0),
        reason                   TEXT NOT NULL,
        round_id                 TEXT NOT NULL,
        requested_expires_at_ms  BIGINT NOT NULL,
        expires_at               TIMESTAMPTZ NOT NULL,
        placed_at                TIMESTAMPTZ NOT NULL,
        status                   TEXT NOT NULL CHECK (status IN ('open', 'posted', 'voided', 'expired')),
        posted_minor             BIGINT NOT NULL DEFAULT 0,
        released_minor           BIGINT NOT NULL DEFAULT 0,
        resolved_at              TIMESTAMPTZ,
        resolved_by              TEXT NOT NULL DEFAULT '',
        postings                 JSONB NOT NULL DEFAULT '[]',
        -- amount_minor stays what PlaceHold asked; this (NULL: never resized) is what the hold
        -- holds after its last ResizeHold.
        resized_minor            BIGINT CHECK (resized_minor > 0)
    )
    """,
    "CREATE INDEX IF NOT EXISTS wallet_holds_open_idx ON wallet_holds (expires_at) WHERE status = 'open'",
    "CREATE INDEX IF NOT EXISTS wallet_holds_account_idx ON wallet_holds (account, seq)",
    """
    CREATE TABLE IF NOT EXISTS wallet_hold_resizes (
        resize_id       TEXT PRIMARY KEY,
        hold_id         TEXT NOT NULL REFERENCES wallet_holds (hold_id),
        previous_minor  BIGINT NOT NULL CHECK (previous_minor > 0),
        amount_minor    BIGINT NOT NULL CHECK (amount_minor > 0),
        resized_at      TIMESTAMPTZ NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS wallet_hold_resizes_hold_idx ON wallet_hold_resizes (hold_id, resized_at)",
    """
    CREATE TABLE IF NOT EXISTS wallet_entries (
        entry_id         BIGSERIAL PRIMARY KEY,
        account          TEXT NOT NULL,
        movement_id      TEXT NOT NULL,
        kind             TEXT NOT NULL,
        source           TEXT NOT NULL,
        available_delta  BIGINT NOT NULL,
        held_delta       BIGINT NOT NULL,
        round_id         TEXT NOT NULL,
        hold_id          TEXT NOT NULL,
        bet_id           TEXT NOT NULL,
        occurred_at      TIMESTAMPTZ NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS wallet_entries_account_idx ON wallet_entries (account, entry_id)",
    "CREATE INDEX IF NOT EXISTS wallet_entries_window_idx ON wallet_entries (account, source, occurred_at)",
    """
    CREATE TABLE IF NOT EXISTS wallet_requests (
        request_key      TEXT PRIMARY KEY,
        fingerprint      TEXT NOT NULL,
        movement_id      TEXT NOT NULL,
        account          TEXT NOT NULL,
        available_minor  BIGINT NOT NULL,
        held_minor       BIGINT NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS wallet_limits (
        account               TEXT NOT NULL,
        kind                  TEXT NOT NULL,
        value                 BIGINT NOT NULL,
        pending_value         BIGINT,
        pending_effective_at  TIMESTAMPTZ,
        PRIMARY KEY (account, kind)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS wallet_exclusions (
        account    TEXT PRIMARY KEY,
        until      TIMESTAMPTZ,
        permanent  BOOLEAN NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS wallet_rounds (
        round_id    TEXT PRIMARY KEY,
        table_id    TEXT NOT NULL,
        status      TEXT NOT NULL CHECK (status IN ('settled', 'voided', 'rejected')),
        version     BIGINT NOT NULL,
        digest      TEXT NOT NULL,
        reason      TEXT NOT NULL,
        detail      TEXT NOT NULL,
        updated_at  TIMESTAMPTZ NOT NULL
    )
    """,
    # The rounds whose settlement was refused and that no operator has resolved yet (few, never many).
    "CREATE INDEX IF NOT EXISTS wallet_rounds_rejected_idx ON wallet_rounds (round_id) WHERE status = 'rejected'",
    # A guard inside a statement (for writes queued in pipeline mode, whose row counts the caller
    # cannot read before the COMMIT travels): fails the statement, and so the transaction.
    """
    CREATE OR REPLACE FUNCTION wallet_require(ok BOOLEAN, message TEXT) RETURNS VOID LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT ok THEN
            RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = message;
        END IF;
    END
    $$
    """,
)


async def setup(conn: psycopg.AsyncConnection) -> None:
    """Create the tables and the accounts that exist from the start (system accounts, the cashier) in a
    scratch schema for tests: a service's database gets them from its migrations (niuniu-migrate)."""
    await run_ddl(conn, SCHEMA)
    async with conn.transaction():
        await conn.cursor().executemany(
            "INSERT INTO wallet_accounts (account, kind) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            [(account, kind.value) for account, kind in OPENING_ACCOUNTS.items()],
        )


# --------------------------------------------------------------------------- accounts


@dataclass(frozen=True, slots=True)
class LockedAccount:
    state: AccountState
    version: int  # of the account's event stream


LOCK_ACCOUNTS = (
    "SELECT account, kind, available_minor, held_minor, version FROM wallet_accounts"
    " WHERE account = ANY(%s) ORDER BY account FOR UPDATE"
)


async def lock_accounts(conn: psycopg.AsyncConnection, accounts: Iterable[str]) -> dict[str, LockedAccount]:
    """Lock the existing ones of ``accounts`` (in name order) and return them."""
    cur = await conn.execute(LOCK_ACCOUNTS, (sorted(set(accounts)),))
    return locked_from_rows(await cur.fetchall())


def locked_from_rows(rows: Iterable[Sequence[Any]]) -> dict[str, LockedAccount]:
    return {r[0]: LockedAccount(AccountState(r[0], AccountKind(r[1]), int(r[2]), int(r[3])), int(r[4])) for r in rows}


async def account(conn: psycopg.AsyncConnection, name: str) -> AccountState | None:
    cur = await conn.execute(
        "SELECT account, kind, available_minor, held_minor FROM wallet_accounts WHERE account = %s", (name,)
    )
    r = await cur.fetchone()
    return AccountState(r[0], AccountKind(r[1]), int(r[2]), int(r[3])) if r else None


async def insert_account(conn: psycopg.AsyncConnection, name: str, kind: AccountKind) -> None:
    await conn.execute("INSERT INTO wallet_accounts (account, kind) VALUES (%s, %s)", (name, kind.value))


async def bump_version(conn: psycopg.AsyncConnection, name: str, version: int) -> None:
    await conn.execute("UPDATE wallet_accounts SET version = %s WHERE account = %s", (version, name))


_SAVE_MOVEMENTS = """
WITH moved AS (
    UPDATE wallet_accounts a SET available_minor = a.available_minor + d.available, held_minor = a.held_minor + d.held,
                                 version = coalesce(d.version, a.version)
    FROM unnest(%(accounts)b::text[], %(available)b::bigint[], %(held)b::bigint[], %(versions)b::bigint[])
        AS d (account, available, held, version)
    WHERE a.account = d.account
)
INSERT INTO wallet_entries (account, movement_id, kind, source, available_delta, held_delta, round_id, hold_id, bet_id,
                            occurred_at)
SELECT e.account, e.movement_id, e.kind, %(source)s, e.available, e.held, e.round_id, e.hold_id, e.bet_id, %(now)s
FROM unnest(%(e_account)b::text[], %(e_movement)b::text[], %(e_kind)b::text[], %(e_available)b::bigint[],
            %(e_held)b::bigint[], %(e_round)b::text[], %(e_hold)b::text[], %(e_bet)b::text[])
    WITH ORDINALITY AS e (account, movement_id, kind, available, held, round_id, hold_id, bet_id, n)
ORDER BY e.n
"""


async def save_movements(
    conn: psycopg.AsyncConnection,
    movements: Sequence[Movement],
    source: str,
    now: datetime,
    versions: Mapping[str, int] | None = None,
) -> None:
    """Apply the movements' net effect to the balances and write one entry per movement and account.

    One statement: the balance updates and the entries (in movement order, so entry ids follow it),
    with the accounts' new stream ``versions`` when given (set by the same row update).
    """
    versions = versions or {}
    if not movements and not versions:
        return
    net = net_by_account(movements)
    for name in sorted(versions.keys() - net.keys()):
        net[name] = (0, 0)
    rows: list[tuple[Any, ...]] = []
    for m in movements:
        for name, (d_available, d_held) in net_by_account([m]).items():
            if d_available or d_held:
                rows.append((name, m.movement_id, m.kind, d_available, d_held, m.round_id, m.hold_id, m.bet_id))
    columns = list(zip(*rows, strict=True)) if rows else [()] * 8
    await conn.execute(
        _SAVE_MOVEMENTS,
        {
            "accounts": list(net),
            "available": [d[0] for d in net.values()],
            "held": [d[1] for d in net.values()],
            "versions": [versions.get(name) for name in net],
            "source": source,
            "now": now,
            **{
                key: list(column)
                for key, column in zip(
                    ("e_account", "e_movement", "e_kind", "e_available", "e_held", "e_round", "e_hold", "e_bet"),
                    columns,
                    strict=True,
                )
            },
        },
    )


async def balances_page(conn: psycopg.AsyncConnection, after: str, limit: int) -> list[AccountState]:
    cur = await conn.execute(
        "SELECT account, kind, available_minor, held_minor FROM wallet_accounts WHERE account > %s"
        " ORDER BY account LIMIT %s",
        (after, limit),
    )
    return [AccountState(r[0], AccountKind(r[1]), int(r[2]), int(r[3])) for r in await cur.fetchall()]


async def hold_appends(conn: psycopg.AsyncConnection) -> None:
    """In a READ COMMITTED transaction: wait for the appends in flight and hold new ones until it ends.

    Appends do not serialize on a store-wide lock, so a snapshot taken while one is in
    flight may miss an event with a smaller position than one it sees. Taken first, this
    makes balances read afterwards exactly those of every event up to ``store_position``.
    """
    await wait_for_appends(conn)


async def store_position(conn: psycopg.AsyncConnection) -> int:
    return await last_position(conn)


async def published_below(conn: psycopg.AsyncConnection) -> int:
    """Every wallet event with a smaller position is in Kafka (acknowledged to the wallet's relays)."""
    return await relays_published_below(conn)


@dataclass(frozen=True, slots=True)
class Entry:
    entry_id: int
    movement_id: str
    kind: str
    available_delta: int
    held_delta: int
    round_id: str
    hold_id: str
    bet_id: str
    occurred_at: datetime


async def entries_page(conn: psycopg.AsyncConnection, name: str, before_id: int, limit: int) -> list[Entry]:
    cur = await conn.execute(
        "SELECT entry_id, movement_id, kind, available_delta, held_delta, round_id, hold_id, bet_id, occurred_at"
        " FROM wallet_entries WHERE account = %s AND entry_id < %s ORDER BY entry_id DESC LIMIT %s",
        (name, before_id, limit),
    )
    return [Entry(int(r[0]), r[1], r[2], int(r[3]), int(r[4]), r[5], r[6], r[7], r[8]) for r in await cur.fetchall()]


# --------------------------------------------------------------------------- idempotent requests


@dataclass(frozen=True, slots=True)
class StoredRequest:
    fingerprint: str
    movement_id: str
    balance: AccountState


async def request(conn: psycopg.AsyncConnection, key: str) -> StoredRequest | None:
    cur = await conn.execute(
        "SELECT fingerprint, movement_id, account, available_minor, held_minor FROM wallet_requests"
        " WHERE request_key = %s",
        (key,),
    )
    r = await cur.fetchone()
    if r is None:
        return None
    return StoredRequest(r[0], r[1], AccountState(r[2], AccountKind.PLAYER, int(r[3]), int(r[4])))


async def insert_request(conn: psycopg.AsyncConnection, key: str, stored: StoredRequest) -> None:
    b = stored.balance
    await conn.execute(
        "INSERT INTO wallet_requests (request_key, fingerprint, movement_id, account, available_minor, held_minor)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        (key, stored.fingerprint, stored.movement_id, b.account, b.available_minor, b.held_minor),
    )
