"""The wallet's tables: current state next to the event store, written in the same transaction.

Balances live in ``wallet_accounts``; every change of them is also an entry in
``wallet_entries`` (one row per movement and account) and an event with legs, so
the sum of an account's entries is its balance and the events rebuild both.
Rows are locked in account-name order, then holds, so concurrent commands queue
instead of deadlocking.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from backbone.db import each_by_key, run_ddl
from backbone.eventreads import last_position
from backbone.eventstore import wait_for_appends
from bull.accounts import OPENING_ACCOUNTS
from services.wallet.domain import AccountKind, AccountState, HoldStatus, Movement, net_by_account
from services.wallet.domain_holds import Hold, HoldRequest, Resize, ResizeRequest
from services.wallet.domain_play import Exclusion, LimitKind, LimitSetting

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


_LOCK_ACCOUNTS = (
    "SELECT account, kind, available_minor, held_minor, version FROM wallet_accounts"
    " WHERE account = ANY(%s) ORDER BY account FOR UPDATE"
)


async def lock_accounts(conn: psycopg.AsyncConnection, accounts: Iterable[str]) -> dict[str, LockedAccount]:
    """Lock the existing ones of ``accounts`` (in name order) and return them."""
    cur = await conn.execute(_LOCK_ACCOUNTS, (sorted(set(accounts)),))
    return _locked(await cur.fetchall())


def _locked(rows: Iterable[Sequence[Any]]) -> dict[str, LockedAccount]:
    return {r[0]: LockedAccount(AccountState(r[0], AccountKind(r[1]), int(r[2]), int(r[3])), int(r[4])) for r in rows}


@dataclass(frozen=True, slots=True)
class HoldContexts:
    """What PlaceHold decides on, for a group of holds: their accounts (locked), earlier holds of
    their ids, the accounts' settings and which of their rounds the wallet has settled."""

    accounts: dict[str, LockedAccount]
    existing: dict[str, Hold]
    limits: dict[str, dict[LimitKind, LimitSetting]]
    exclusions: dict[str, Exclusion]
    ended_rounds: frozenset[str]


async def hold_contexts(
    conn: psycopg.AsyncConnection, accounts: Iterable[str], hold_ids: Iterable[str], round_ids: Iterable[str]
) -> HoldContexts:
    """Lock the accounts (in name order) and read the rest PlaceHold needs: five statements, one
    round trip in pipeline mode, whatever the number of holds.

    The row locks come first; the reads after them (READ COMMITTED: each statement its own
    snapshot) see every hold and setting committed before the locks were granted.
    """
    names = sorted(set(accounts))
    locked = await conn.execute(
        "SELECT account, kind, available_minor, held_minor, version FROM wallet_accounts"
        " WHERE account = ANY(%s) ORDER BY account FOR UPDATE",
        (names,),
    )
    held = await conn.execute(_HOLDS, (sorted(set(hold_ids)),))
    limit_rows = await conn.execute(
        "SELECT account, kind, value, pending_value, pending_effective_at FROM wallet_limits WHERE account = ANY(%s)",
        (names,),
    )
    excluded = await conn.execute(
        "SELECT account, until, permanent FROM wallet_exclusions WHERE account = ANY(%s)", (names,)
    )
    ended = await conn.execute(
        "SELECT round_id FROM wallet_rounds WHERE round_id = ANY(%s) AND round_id <> ''"
        " AND status IN ('settled', 'voided')",
        (sorted(set(round_ids)),),
    )
    found = {
        r[0]: LockedAccount(AccountState(r[0], AccountKind(r[1]), int(r[2]), int(r[3])), int(r[4]))
        for r in await locked.fetchall()
    }
    existing = _holds_by_id(await held.fetchall())
    settings: dict[str, dict[LimitKind, LimitSetting]] = {}
    for r in await limit_rows.fetchall():
        kind = LimitKind(r[1])
        settings.setdefault(r[0], {})[kind] = LimitSetting(kind, int(r[2]), None if r[3] is None else int(r[3]), r[4])
    exclusions = {r[0]: Exclusion(r[1], bool(r[2])) for r in await excluded.fetchall()}
    ended_rounds = frozenset(str(r[0]) for r in await ended.fetchall())
    return HoldContexts(found, existing, settings, exclusions, ended_rounds)


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


async def window_sums(conn: psycopg.AsyncConnection, name: str, now: datetime) -> dict[LimitKind, int]:
    """Deposits and net losses (posts and settlements) over each money limit's rolling window."""
    day, week = now - LimitKind.DAILY_LOSS.window, now - LimitKind.WEEKLY_LOSS.window
    cur = await conn.execute(
        "SELECT"
        " coalesce(sum(available_delta) FILTER (WHERE source = 'deposit' AND occurred_at > %(day)s), 0),"
        " coalesce(sum(available_delta) FILTER (WHERE source = 'deposit'), 0),"
        " coalesce(sum(available_delta + held_delta) FILTER (WHERE source <> 'deposit' AND occurred_at > %(day)s), 0),"
        " coalesce(sum(available_delta + held_delta) FILTER (WHERE source <> 'deposit'), 0)"
        " FROM wallet_entries WHERE account = %(account)s AND source IN ('deposit', 'post', 'settlement')"
        " AND occurred_at > %(week)s AND occurred_at <= %(now)s",
        {"account": name, "day": day, "week": week, "now": now},
    )
    row = await cur.fetchone()
    assert row is not None
    return {
        LimitKind.DAILY_DEPOSIT: int(row[0]),
        LimitKind.WEEKLY_DEPOSIT: int(row[1]),
        LimitKind.DAILY_LOSS: max(0, -int(row[2])),
        LimitKind.WEEKLY_LOSS: max(0, -int(row[3])),
    }


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


# --------------------------------------------------------------------------- holds

_HOLD_COLUMNS = (
    "hold_id, account, amount_minor, reason, round_id, requested_expires_at_ms, expires_at, placed_at, status,"
    " posted_minor, released_minor, resolved_at, resolved_by, postings, resized_minor"
)


def _holds_by_id(rows: Iterable[Sequence[Any]]) -> dict[str, Hold]:
    return {h.hold_id: h for h in map(_hold, rows)}


def _hold(r: Sequence[Any]) -> Hold:
    return Hold(
        HoldRequest(r[0], r[1], int(r[2]), r[3], r[4], int(r[5])),
        expires_at=r[6],
        placed_at=r[7],
        status=HoldStatus(r[8]),
        posted_minor=int(r[9]),
        released_minor=int(r[10]),
        resolved_at=r[11],
        resolved_by=r[12],
        postings=tuple((str(p), int(a)) for p, a in r[13]),
        resized_minor=None if r[14] is None else int(r[14]),
    )


_HOLDS = each_by_key("wallet_holds", "hold_id", _HOLD_COLUMNS)
# Locked in the ids' order: the callers sort them.
_LOCK_HOLDS = each_by_key("wallet_holds", "hold_id", _HOLD_COLUMNS, lock=True)


async def holds(conn: psycopg.AsyncConnection, hold_ids: Iterable[str], *, lock: bool = False) -> dict[str, Hold]:
    ids = sorted(set(hold_ids))
    if not ids:
        return {}
    cur = await conn.execute(_LOCK_HOLDS if lock else _HOLDS, (ids,))
    return _holds_by_id(await cur.fetchall())


async def hold(conn: psycopg.AsyncConnection, hold_id: str, *, lock: bool = False) -> Hold | None:
    return (await holds(conn, [hold_id], lock=lock)).get(hold_id)


async def insert_holds(conn: psycopg.AsyncConnection, placed: Sequence[Hold]) -> None:
    """``insert_hold`` for several holds in one statement."""
    if not placed:
        return
    await conn.execute(
        "INSERT INTO wallet_holds (hold_id, account, amount_minor, reason, round_id, requested_expires_at_ms,"
        " expires_at, placed_at, status)"
        " SELECT * FROM unnest(%b::text[], %b::text[], %b::bigint[], %b::text[], %b::text[], %b::bigint[],"
        " %b::timestamptz[], %b::timestamptz[], %b::text[])",
        (
            [h.request.hold_id for h in placed],
            [h.request.account for h in placed],
            [h.request.amount_minor for h in placed],
            [h.request.reason for h in placed],
            [h.request.round_id for h in placed],
            [h.request.expires_at_unix_ms for h in placed],
            [h.expires_at for h in placed],
            [h.placed_at for h in placed],
            [h.status.value for h in placed],
        ),
    )


async def save_resolutions(conn: psycopg.AsyncConnection, resolved: Sequence[Hold]) -> None:
    """Record each hold's one resolution, in one statement; the ``status = 'open'`` guard makes a second
    one impossible."""
    if not resolved:
        return
    # Checked in the statement (``wallet_require``), so the write may be queued in a pipeline.
    await conn.execute(
        "WITH resolved AS ("
        " UPDATE wallet_holds h SET status = r.status, posted_minor = r.posted, released_minor = r.released,"
        " resolved_at = r.resolved_at, resolved_by = r.resolved_by, postings = r.postings::jsonb"
        " FROM unnest(%b::text[], %b::text[], %b::bigint[], %b::bigint[], %b::timestamptz[], %b::text[], %b::text[])"
        " AS r (hold_id, status, posted, released, resolved_at, resolved_by, postings)"
        " WHERE h.hold_id = r.hold_id AND h.status = 'open' RETURNING 1)"
        " SELECT wallet_require(count(*) = %s, (%s - count(*)) || ' of the holds were not open') FROM resolved",
        (
            [h.hold_id for h in resolved],
            [h.status.value for h in resolved],
            [h.posted_minor for h in resolved],
            [h.released_minor for h in resolved],
            [h.resolved_at for h in resolved],
            [h.resolved_by for h in resolved],
            [json.dumps([list(p) for p in h.postings]) for h in resolved],
            # Each hold once, and open until now (a hold named twice updates one row).
            len(resolved),
            len(resolved),
        ),
    )


async def save_resize(conn: psycopg.AsyncConnection, resized: Hold, resize: Resize) -> None:
    """Record the resize and the hold's new amount; the ``status = 'open'`` guard as in save_resolutions."""
    q = resize.request
    await conn.execute(
        "INSERT INTO wallet_hold_resizes (resize_id, hold_id, previous_minor, amount_minor, resized_at)"
        " VALUES (%s, %s, %s, %s, %s)",
        (q.resize_id, q.hold_id, resize.previous_minor, q.amount_minor, resize.resized_at),
    )
    cur = await conn.execute(
        "UPDATE wallet_holds SET resized_minor = %s WHERE hold_id = %s AND status = 'open'",
        (resized.resized_minor, resized.hold_id),
    )
    assert cur.rowcount == 1, f"hold {resized.hold_id} was not open"


async def hold_resize(conn: psycopg.AsyncConnection, resize_id: str) -> Resize | None:
    cur = await conn.execute(
        "SELECT resize_id, hold_id, amount_minor, previous_minor, resized_at FROM wallet_hold_resizes"
        " WHERE resize_id = %s",
        (resize_id,),
    )
    r = await cur.fetchone()
    return Resize(ResizeRequest(r[0], r[1], int(r[2])), int(r[3]), r[4]) if r else None


async def holds_page(
    conn: psycopg.AsyncConnection, name: str, include_resolved: bool, before_seq: int, limit: int
) -> list[tuple[int, Hold]]:
    status = "" if include_resolved else " AND status = 'open'"
    cur = await conn.execute(
        f"SELECT seq, {_HOLD_COLUMNS} FROM wallet_holds WHERE account = %s AND seq < %s{status}"
        " ORDER BY seq DESC LIMIT %s",
        (name, before_seq, limit),
    )
    return [(int(r[0]), _hold(r[1:])) for r in await cur.fetchall()]


async def due_holds(conn: psycopg.AsyncConnection, now: datetime, limit: int) -> list[tuple[str, str]]:
    """(hold id, account) of open holds past their time, oldest first."""
    cur = await conn.execute(
        "SELECT hold_id, account FROM wallet_holds WHERE status = 'open' AND expires_at <= %s"
        " ORDER BY expires_at LIMIT %s",
        (now, limit),
    )
    return [(r[0], r[1]) for r in await cur.fetchall()]


# (hold id, account) of the round's open holds that are not among the hold ids given.
_OPEN_HOLDS_OF_ROUND = (
    "SELECT hold_id, account FROM wallet_holds WHERE status = 'open' AND round_id = %s"
    " AND NOT (hold_id = ANY(%b::text[])) ORDER BY hold_id"
)


async def settlement_holds(
    conn: psycopg.AsyncConnection, round_id: str, hold_ids: Sequence[str]
) -> tuple[dict[str, Hold], list[tuple[str, str]]]:
    """A settlement's holds and (hold id, account) of its round's other open holds, in one round trip."""
    ids = sorted(set(hold_ids))
    async with conn.pipeline():
        named = await conn.execute(_HOLDS, (ids,))
        others = await conn.execute(_OPEN_HOLDS_OF_ROUND, (round_id, ids))
    return (
        _holds_by_id(await named.fetchall()),
        [(r[0], r[1]) for r in await others.fetchall()],
    )


@dataclass(frozen=True, slots=True)
class SettlementLocks:
    accounts: dict[str, LockedAccount]
    holds: dict[str, Hold]
    strays: list[tuple[str, str]]  # (hold id, account) of the round's open holds the settlement does not name


async def lock_for_settlement(
    conn: psycopg.AsyncConnection, round_id: str, accounts: Iterable[str], hold_ids: Sequence[str]
) -> SettlementLocks:
    """Lock the accounts, then the holds (the usual order), and read the round's other open holds
    after both locks: one round trip."""
    ids = sorted(set(hold_ids))
    async with conn.pipeline():
        locked = await conn.execute(_LOCK_ACCOUNTS, (sorted(set(accounts)),))
        held = await conn.execute(_LOCK_HOLDS, (ids,))
        others = await conn.execute(_OPEN_HOLDS_OF_ROUND, (round_id, ids))
    return SettlementLocks(
        _locked(await locked.fetchall()),
        _holds_by_id(await held.fetchall()),
        [(r[0], r[1]) for r in await others.fetchall()],
    )


async def open_hold_stats(conn: psycopg.AsyncConnection) -> tuple[int, datetime | None]:
    cur = await conn.execute("SELECT count(*), min(placed_at) FROM wallet_holds WHERE status = 'open'")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), row[1]


async def rejected_round_count(conn: psycopg.AsyncConnection) -> int:
    """Rounds still rejected: an operator's repair (a void) or a re-sent settlement takes a round out."""
    cur = await conn.execute("SELECT count(*) FROM wallet_rounds WHERE status = 'rejected'")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


# --------------------------------------------------------------------------- responsible play


async def limits(conn: psycopg.AsyncConnection, name: str) -> dict[LimitKind, LimitSetting]:
    cur = await conn.execute(
        "SELECT kind, value, pending_value, pending_effective_at FROM wallet_limits WHERE account = %s", (name,)
    )
    return {
        LimitKind(r[0]): LimitSetting(LimitKind(r[0]), int(r[1]), None if r[2] is None else int(r[2]), r[3])
        for r in await cur.fetchall()
    }


async def save_limit(conn: psycopg.AsyncConnection, name: str, s: LimitSetting) -> None:
    await conn.execute(
        "INSERT INTO wallet_limits (account, kind, value, pending_value, pending_effective_at)"
        " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (account, kind) DO UPDATE SET value = EXCLUDED.value,"
        " pending_value = EXCLUDED.pending_value, pending_effective_at = EXCLUDED.pending_effective_at",
        (name, s.kind.value, s.value, s.pending_value, s.pending_effective_at),
    )


async def exclusion(conn: psycopg.AsyncConnection, name: str) -> Exclusion:
    cur = await conn.execute("SELECT until, permanent FROM wallet_exclusions WHERE account = %s", (name,))
    r = await cur.fetchone()
    return Exclusion(r[0], bool(r[1])) if r else Exclusion()


async def save_exclusion(conn: psycopg.AsyncConnection, name: str, e: Exclusion) -> None:
    await conn.execute(
        "INSERT INTO wallet_exclusions (account, until, permanent) VALUES (%s, %s, %s)"
        " ON CONFLICT (account) DO UPDATE SET until = EXCLUDED.until, permanent = EXCLUDED.permanent",
        (name, e.until, e.permanent),
    )


# --------------------------------------------------------------------------- users


@dataclass(frozen=True, slots=True)
class User:
    account_id: str
    username: str
    email: str
    password_hash: str
    role: str
    request_id: str | None
    created_at: datetime


_USER_COLUMNS = "account_id, username, email, password_hash, role, request_id, created_at"


def _user(r: Sequence[Any]) -> User:
    return User(str(r[0]), r[1], r[2], r[3], r[4], r[5], r[6])


async def user_by(conn: psycopg.AsyncConnection, column: str, value: str) -> User | None:
    assert column in ("account_id", "username", "request_id")
    cur = await conn.execute(f"SELECT {_USER_COLUMNS} FROM wallet_users WHERE {column} = %s", (value,))
    r = await cur.fetchone()
    return _user(r) if r else None


async def insert_user(conn: psycopg.AsyncConnection, u: User) -> None:
    await conn.execute(
        f"INSERT INTO wallet_users ({_USER_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (u.account_id, u.username, u.email, u.password_hash, u.role, u.request_id, u.created_at),
    )


async def update_password_hash(conn: psycopg.AsyncConnection, account_id: str, password_hash: str) -> None:
    await conn.execute("UPDATE wallet_users SET password_hash = %s WHERE account_id = %s", (password_hash, account_id))


# --------------------------------------------------------------------------- rounds


@dataclass(frozen=True, slots=True)
class RoundRecord:
    round_id: str
    table_id: str
    status: str
    version: int
    digest: str
    reason: str
    detail: str
    updated_at: datetime


async def round_record(conn: psycopg.AsyncConnection, round_id: str, *, lock: bool = False) -> RoundRecord | None:
    suffix = " FOR UPDATE" if lock else ""
    cur = await conn.execute(
        "SELECT round_id, table_id, status, version, digest, reason, detail, updated_at FROM wallet_rounds"
        f" WHERE round_id = %s{suffix}",
        (round_id,),
    )
    r = await cur.fetchone()
    return RoundRecord(r[0], r[1], r[2], int(r[3]), r[4], r[5], r[6], r[7]) if r else None


async def save_round(conn: psycopg.AsyncConnection, r: RoundRecord) -> None:
    await conn.execute(
        "INSERT INTO wallet_rounds (round_id, table_id, status, version, digest, reason, detail, updated_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (round_id) DO UPDATE SET"
        " table_id = EXCLUDED.table_id, status = EXCLUDED.status, version = EXCLUDED.version,"
        " digest = EXCLUDED.digest, reason = EXCLUDED.reason, detail = EXCLUDED.detail,"
        " updated_at = EXCLUDED.updated_at",
        (r.round_id, r.table_id, r.status, r.version, r.digest, r.reason, r.detail, r.updated_at),
    )
