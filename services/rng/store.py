"""The rng service's SQL: its tables and every statement on them (the one place it is written).

A round's row holds its server seed, commitment and what was derived from it (the deck, the
envelope split), when, and whether it closed and was revealed. The test tables hold the decks
and splits an rng started for tests forces (``NIUNIU_RNG_TEST_DECKS``). Every function runs in
the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row

from bull import fairness as fair

DDL = (
    """
    CREATE TABLE IF NOT EXISTS rng_rounds (
        round_id              TEXT PRIMARY KEY,
        purpose               TEXT NOT NULL,
        server_seed           BYTEA NOT NULL,
        commitment            TEXT NOT NULL,
        committed_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
        deck_size             INT,
        client_seed           TEXT,
        drawn_at              TIMESTAMPTZ,
        envelope_total_minor  BIGINT,
        envelope_shares       INT,
        envelope_min_minor    BIGINT,
        envelope_client_seed  TEXT,
        split_at              TIMESTAMPTZ,
        closed_at             TIMESTAMPTZ,
        closed_cause          TEXT,
        revealed_at           TIMESTAMPTZ
    )
    """,
    # TEST ONLY (SetTestDeck): read only when the process runs with NIUNIU_RNG_TEST_DECKS=1.
    """
    CREATE TABLE IF NOT EXISTS rng_test_decks (
        round_id  TEXT PRIMARY KEY,
        cards     TEXT[] NOT NULL,
        set_at    TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    # TEST ONLY (SetTestEnvelope): read only when the process runs with NIUNIU_RNG_TEST_DECKS=1.
    """
    CREATE TABLE IF NOT EXISTS rng_test_envelopes (
        round_id    TEXT PRIMARY KEY,
        amounts     BIGINT[] NOT NULL,
        grab_order  INT[] NOT NULL,
        set_at      TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """,
    # The players' client seed contributions each stream's client seed combines (sorted).
    "ALTER TABLE rng_rounds ADD COLUMN IF NOT EXISTS client_seeds TEXT[]",
    "ALTER TABLE rng_rounds ADD COLUMN IF NOT EXISTS envelope_client_seeds TEXT[]",
)


async def insert_round(
    conn: psycopg.AsyncConnection, round_id: str, purpose: str, seed: bytes, commitment: str
) -> bool:
    """A new round's seed and commitment; False when the round was committed before (nothing written)."""
    cur = await conn.execute(
        "INSERT INTO rng_rounds (round_id, purpose, server_seed, commitment) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (round_id) DO NOTHING",
        (round_id, purpose, seed, commitment),
    )
    return cur.rowcount > 0


async def round_row(conn: psycopg.AsyncConnection, round_id: str, *, lock: bool) -> dict[str, Any] | None:
    """The round's row (locked for update with ``lock``), None if it was never committed."""
    query = "SELECT * FROM rng_rounds WHERE round_id = %s" + (" FOR UPDATE" if lock else "")
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, (round_id,))
        return await cur.fetchone()


async def record_draw(
    conn: psycopg.AsyncConnection, round_id: str, deck_size: int, client_seed: str, contributions: Sequence[str]
) -> None:
    await conn.execute(
        "UPDATE rng_rounds SET deck_size = %s, client_seed = %s, client_seeds = %s, drawn_at = now()"
        " WHERE round_id = %s",
        (deck_size, client_seed, list(contributions), round_id),
    )


async def record_split(
    conn: psycopg.AsyncConnection, round_id: str, params: tuple[int, int, int, str], contributions: Sequence[str]
) -> None:
    """The envelope's split: (total, shares, minimum, client seed) and the seed's contributions."""
    await conn.execute(
        "UPDATE rng_rounds SET envelope_total_minor = %s, envelope_shares = %s, envelope_min_minor = %s,"
        " envelope_client_seed = %s, envelope_client_seeds = %s, split_at = now() WHERE round_id = %s",
        (*params, list(contributions), round_id),
    )


async def mark_revealed(conn: psycopg.AsyncConnection, round_id: str) -> None:
    await conn.execute("UPDATE rng_rounds SET revealed_at = now() WHERE round_id = %s", (round_id,))


async def close(conn: psycopg.AsyncConnection, round_id: str, cause: str) -> bool:
    """Mark the round closed; False if it is unknown or closed already."""
    cur = await conn.execute(
        "UPDATE rng_rounds SET closed_at = now(), closed_cause = %s WHERE round_id = %s AND closed_at IS NULL",
        (cause, round_id),
    )
    return cur.rowcount > 0


async def locked_stamp(
    conn: psycopg.AsyncConnection, round_id: str, column: Literal["drawn_at", "split_at"]
) -> Any | None:
    """When the round was drawn or split (its row locked for update); None if not, or not committed yet."""
    cur = await conn.execute(f"SELECT {column} FROM rng_rounds WHERE round_id = %s FOR UPDATE", (round_id,))
    row = await cur.fetchone()
    return row[0] if row is not None else None


async def save_test_deck(conn: psycopg.AsyncConnection, round_id: str, cards: Sequence[str]) -> None:
    """TEST ONLY: the deck order the round's draw will return."""
    await conn.execute(
        "INSERT INTO rng_test_decks (round_id, cards) VALUES (%s, %s)"
        " ON CONFLICT (round_id) DO UPDATE SET cards = excluded.cards, set_at = now()",
        (round_id, list(cards)),
    )


async def test_deck(conn: psycopg.AsyncConnection, round_id: str) -> tuple[str, ...] | None:
    """TEST ONLY: the round's forced deck order, if one was set."""
    cur = await conn.execute("SELECT cards FROM rng_test_decks WHERE round_id = %s", (round_id,))
    row = await cur.fetchone()
    return tuple(row[0]) if row else None


async def save_test_envelope(
    conn: psycopg.AsyncConnection, round_id: str, amounts: Sequence[int], grab_order: Sequence[int]
) -> None:
    """TEST ONLY: the split the round's SplitEnvelope will return."""
    await conn.execute(
        "INSERT INTO rng_test_envelopes (round_id, amounts, grab_order) VALUES (%s, %s, %s)"
        " ON CONFLICT (round_id) DO UPDATE"
        " SET amounts = excluded.amounts, grab_order = excluded.grab_order, set_at = now()",
        (round_id, list(amounts), list(grab_order)),
    )


async def test_envelope(conn: psycopg.AsyncConnection, round_id: str) -> fair.Split | None:
    """TEST ONLY: the round's forced split, if one was set."""
    cur = await conn.execute("SELECT amounts, grab_order FROM rng_test_envelopes WHERE round_id = %s", (round_id,))
    row = await cur.fetchone()
    return fair.Split(tuple(row[0]), tuple(row[1])) if row else None
