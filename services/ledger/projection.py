"""The journal projection: one handler for the live consumer and for the audit replay.

It consumes the wallet events (money: journal entries, lines, balances, rejects)
and the table events (references: the round index). Each event is written in the
consumer's transaction together with its tracking row, so it is journaled exactly
once; the balances move in the same transaction as the lines that explain them.

The live consumers apply a batch of new events at a time (``journal_batch``, ``rounds_batch``)
with the careful writer the replay falls back to for a poll (``StagedJournal.write``: the batch
staged with COPY, a few statements that skip rows there already); a replay first writes each poll
straight into the journal's tables (``StagedJournal.write_all_new``). ``apply`` is the same
projection one event at a time, the reference the tests hold all three to
(``tests/ledger/test_replay_staged.py``).

The journal is append-only: there is no UPDATE or DELETE of its tables in the code, and
triggers refuse them (and TRUNCATE) in the database.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from datetime import UTC
from typing import Any

import psycopg
from niuniu.v1 import events_pb2

from backbone.handlers import BatchHandler, Tracked, batched
from backbone.replay.model import Projection, fresh_stage
from services.ledger import metrics
from services.ledger.accounts import account_type
from services.ledger.journal import Entry, Reason, Rejected, journal_event
from services.ledger.journal_writes import (
    MOVE_BALANCES_BY_LINES,
    ROUND_SETTLED,
    ROUND_VOIDED,
    Position,
    record_reject,
    round_rows,
)
from services.ledger.staged_journal import STAGE_COLUMNS, STAGE_DDL, StagedJournal, stage_ddl, stage_journal

log = logging.getLogger(__name__)

# The live consumer and the replay must share this name: the handler finds the
# event's Kafka position in the tracking row the consumer wrote under it.
CONSUMER = "ledger-journal"
# The live consumer of the table events (round index); the replay reads them under CONSUMER.
ROUNDS_CONSUMER = "ledger-rounds"

APPEND_ONLY_TABLES = ("journal_entries", "journal_lines", "journal_rejects")

DDL: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS journal_entries (
        entry_id         TEXT PRIMARY KEY,
        seq              BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
        event_id         UUID NOT NULL,
        movement_index   INT NOT NULL,
        event_type       TEXT NOT NULL,
        kind             TEXT NOT NULL,
        round_id         TEXT NOT NULL,
        hold_id          TEXT NOT NULL,
        bet_id           TEXT NOT NULL,
        occurred_at      TIMESTAMPTZ NOT NULL,
        topic            TEXT NOT NULL,
        partition        INT NOT NULL,
        "offset"         BIGINT NOT NULL,
        wallet_position  BIGINT NOT NULL,
        UNIQUE (event_id, movement_index)
    )
    """,
    "CREATE INDEX IF NOT EXISTS journal_entries_round_idx ON journal_entries (round_id)",
    "CREATE INDEX IF NOT EXISTS journal_entries_hold_idx ON journal_entries (hold_id) WHERE hold_id <> ''",
    "CREATE INDEX IF NOT EXISTS journal_entries_time_idx ON journal_entries (occurred_at)",
    "CREATE INDEX IF NOT EXISTS journal_entries_position_idx ON journal_entries (wallet_position)",
    """
    CREATE TABLE IF NOT EXISTS journal_lines (
        entry_id      TEXT NOT NULL REFERENCES journal_entries (entry_id),
        line_no       INT NOT NULL,
        account       TEXT NOT NULL,
        bucket        TEXT NOT NULL CHECK (bucket IN ('available', 'held')),
        debit_minor   BIGINT NOT NULL CHECK (debit_minor >= 0),
        credit_minor  BIGINT NOT NULL CHECK (credit_minor >= 0),
        PRIMARY KEY (entry_id, line_no),
        CHECK ((debit_minor = 0) <> (credit_minor = 0))
    )
    """,
    "CREATE INDEX IF NOT EXISTS journal_lines_account_idx ON journal_lines (account, entry_id)",
    """
    CREATE TABLE IF NOT EXISTS balances (
        account        TEXT NOT NULL,
        bucket         TEXT NOT NULL,
        account_type   SMALLINT NOT NULL,
        debit_minor    BIGINT NOT NULL,
        credit_minor   BIGINT NOT NULL,
        balance_minor  BIGINT NOT NULL,
        lines          BIGINT NOT NULL,
        PRIMARY KEY (account, bucket),
        CHECK (balance_minor = credit_minor - debit_minor)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS journal_rejects (
        event_id         UUID NOT NULL,
        movement_index   INT NOT NULL,
        entry_id         TEXT NOT NULL,
        event_type       TEXT NOT NULL,
        round_id         TEXT NOT NULL,
        reason           TEXT NOT NULL,
        detail           TEXT NOT NULL,
        movement         BYTEA NOT NULL,
        occurred_at      TIMESTAMPTZ NOT NULL,
        topic            TEXT NOT NULL,
        partition        INT NOT NULL,
        "offset"         BIGINT NOT NULL,
        wallet_position  BIGINT NOT NULL,
        PRIMARY KEY (event_id, movement_index)
    )
    """,
    "CREATE INDEX IF NOT EXISTS journal_rejects_round_idx ON journal_rejects (round_id)",
    """
    CREATE TABLE IF NOT EXISTS rounds (
        round_id     TEXT PRIMARY KEY,
        table_id     TEXT NOT NULL,
        variant      TEXT NOT NULL,
        status       TEXT NOT NULL CHECK (status IN ('settled', 'voided')),
        event_id     UUID NOT NULL,
        occurred_at  TIMESTAMPTZ NOT NULL,
        bets         INT NOT NULL,
        transfers    INT NOT NULL,
        event        BYTEA NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS round_bets (
        round_id     TEXT NOT NULL REFERENCES rounds (round_id),
        bet_id       TEXT NOT NULL,
        player       TEXT NOT NULL,
        area         TEXT NOT NULL,
        stake_minor  BIGINT NOT NULL,
        outcome      TEXT NOT NULL,
        net_minor    BIGINT NOT NULL,
        hold_id      TEXT NOT NULL,
        PRIMARY KEY (round_id, bet_id)
    )
    """,
    """
    CREATE OR REPLACE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'the ledger journal is append-only: % on % is forbidden', TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'restrict_violation';
    END
    $$
    """,
    *(
        statement
        for table in APPEND_ONLY_TABLES
        for statement in (
            f"CREATE OR REPLACE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION ledger_append_only()",
            f"CREATE OR REPLACE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table}"
            " FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only()",
        )
    ),
)

TABLES = ("journal_entries", "journal_lines", "balances", "journal_rejects", "rounds", "round_bets")

# The table events the projection acts on (the round index). The live rounds consumer skips the
# others (bets, reveals: nothing in them to journal or index) without a transaction or tracking row.
ROUND_EVENT_TYPES = ("table.round_settled", "table.round_voided")


async def apply(conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> None:
    """The projection's handler: journal a wallet event, or index a table's round outcome."""
    if envelope.payload.Is(ROUND_SETTLED) or envelope.payload.Is(ROUND_VOIDED):
        await _index_round(conn, envelope)
        return
    journaled = journal_event(envelope)
    entries, rejected = _first_of_each_id(journaled.entries), list(journaled.rejected)
    rejected.extend(_duplicates_within(journaled.entries))
    if entries:
        written = await _write_entries(conn, envelope, entries)
        rejected.extend(
            Rejected(e.movement_index, e.entry_id, Reason.DUPLICATE_ENTRY_ID, "already journaled from another event")
            for e in entries
            if e.entry_id not in written
        )
        metrics.ENTRIES_JOURNALED.inc(len(written))
    if rejected:
        position = await _position(conn, envelope)
        for reject in sorted(rejected, key=lambda r: r.movement_index):
            await record_reject(conn, envelope, position, reject)


def _first_of_each_id(entries: Sequence[Entry]) -> list[Entry]:
    seen: set[str] = set()
    first = []
    for entry in entries:
        if entry.entry_id not in seen:
            seen.add(entry.entry_id)
            first.append(entry)
    return first


def _duplicates_within(entries: Sequence[Entry]) -> list[Rejected]:
    kept = {id(e) for e in _first_of_each_id(entries)}
    return [
        Rejected(e.movement_index, e.entry_id, Reason.DUPLICATE_ENTRY_ID, "the event repeats this movement id")
        for e in entries
        if id(e) not in kept
    ]


async def _position(conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> Position:
    cur = await conn.execute(
        'SELECT topic, partition, "offset" FROM processed_events WHERE consumer = %s AND event_id = %s',
        (CONSUMER, envelope.event_id),
    )
    row = await cur.fetchone()
    if row is None:  # applied outside a consumer (a direct call): no Kafka position
        return Position("", -1, -1, envelope.store_position)
    return Position(str(row[0]), int(row[1]), int(row[2]), envelope.store_position)


# One round trip per event: the entries (taking the Kafka position from the consumer's
# tracking row), their lines and the balance changes of the entries actually inserted.
# An entry id already journaled from another event is not inserted, so neither are its
# lines nor its balance changes; the caller records it as a reject.
_WRITE_ENTRIES = f"""
WITH pos AS (
    SELECT coalesce(p.topic, '') AS topic, coalesce(p.partition, -1) AS partition, coalesce(p."offset", -1) AS "offset"
    FROM (VALUES (1)) AS one (x)
    LEFT JOIN processed_events p ON p.consumer = %(consumer)s AND p.event_id = %(event_id)s::uuid
), new_entries AS (
    INSERT INTO journal_entries (entry_id, event_id, movement_index, event_type, kind, round_id, hold_id, bet_id,
                                 occurred_at, topic, partition, "offset", wallet_position)
    SELECT e.entry_id, %(event_id)s::uuid, e.movement_index, %(event_type)s, e.kind, e.round_id, e.hold_id, e.bet_id,
           %(occurred_at)s, pos.topic, pos.partition, pos."offset", %(wallet_position)s
    FROM unnest(%(entry_ids)b::text[], %(indexes)b::int[], %(kinds)b::text[], %(rounds)b::text[], %(holds)b::text[],
                %(bets)b::text[]) AS e (entry_id, movement_index, kind, round_id, hold_id, bet_id)
    CROSS JOIN pos
    ON CONFLICT DO NOTHING
    RETURNING entry_id
), lines AS (
    SELECT * FROM unnest(%(l_entry)b::text[], %(l_no)b::int[], %(l_account)b::text[], %(l_bucket)b::text[],
                         %(l_type)b::smallint[], %(l_debit)b::bigint[], %(l_credit)b::bigint[])
        AS l (entry_id, line_no, account, bucket, account_type, debit_minor, credit_minor)
    WHERE l.entry_id IN (SELECT entry_id FROM new_entries)
), new_lines AS (
    INSERT INTO journal_lines (entry_id, line_no, account, bucket, debit_minor, credit_minor)
    SELECT entry_id, line_no, account, bucket, debit_minor, credit_minor FROM lines
), moved AS (
{MOVE_BALANCES_BY_LINES}
)
SELECT entry_id FROM new_entries
"""


async def _write_entries(
    conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope, entries: Sequence[Entry]
) -> set[str]:
    """Insert ``entries`` (distinct ids) with their lines and balance changes; returns the ids inserted."""
    lines = [(e.entry_id, n, line) for e in entries for n, line in enumerate(e.lines)]
    for entry in entries:
        # The handler's own invariant (journal.build_entry only returns balanced entries).
        assert entry.debit_minor == entry.credit_minor, f"refusing unbalanced entry {entry.entry_id}"
    cur = await conn.execute(
        _WRITE_ENTRIES,
        {
            "consumer": CONSUMER,
            "event_id": envelope.event_id,
            "event_type": envelope.event_type,
            "occurred_at": envelope.occurred_at.ToDatetime(tzinfo=UTC),
            "wallet_position": envelope.store_position,
            "entry_ids": [e.entry_id for e in entries],
            "indexes": [e.movement_index for e in entries],
            "kinds": [e.kind for e in entries],
            "rounds": [e.round_id for e in entries],
            "holds": [e.hold_id for e in entries],
            "bets": [e.bet_id for e in entries],
            "l_entry": [entry_id for entry_id, _, _ in lines],
            "l_no": [n for _, n, _ in lines],
            "l_account": [line.account for _, _, line in lines],
            "l_bucket": [line.bucket for _, _, line in lines],
            "l_type": [account_type(line.account) for _, _, line in lines],
            "l_debit": [line.debit_minor for _, _, line in lines],
            "l_credit": [line.credit_minor for _, _, line in lines],
        },
    )
    return {str(row[0]) for row in await cur.fetchall()}


async def _index_round(conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> None:
    row, bets = round_rows(envelope)
    cur = await conn.execute(
        "INSERT INTO rounds (round_id, table_id, variant, status, event_id, occurred_at, bets, transfers, event)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (round_id) DO NOTHING",
        row,
    )
    if cur.rowcount == 0:
        log.warning(
            "round already indexed; keeping the first outcome",
            extra={"round_id": row[0], "event_id": envelope.event_id},
        )
        return
    if bets:
        async with conn.cursor() as cursor:
            await cursor.executemany(
                "INSERT INTO round_bets (round_id, bet_id, player, area, stake_minor, outcome, net_minor, hold_id)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                bets,
            )


# In a replay, each event is applied once: no two entries share an event and movement index, and the
# identity ``seq`` repeats nothing. These two are checked when the replay ends instead of on every row
# it writes. The entry id stays unique from the start: an entry id already journaled from another
# event is a reject. So does ``journal_lines_pkey``, though lines are written only with their new
# entry: built at the end it lay on the longest path of the end's builds (the lines' two indexes one
# after the other, then their foreign key), while the poll's writes, which now wait for the stager,
# had room for it (alternating ``bench-replay --events 200000``: 24 679-27 218 events/s with it at the
# end, 26 792-28 766 kept from the start).
IMPLIED_BY_EXACTLY_ONCE = (
    "journal_entries_seq_key",
    "journal_entries_event_id_movement_index_key",
)

JOURNAL = Projection(
    name=CONSUMER,
    ddl=DDL,
    handler=apply,
    tables=TABLES,
    stager=stage_journal,
    stage_ddl=STAGE_DDL,
    implied_unique=IMPLIED_BY_EXACTLY_ONCE,
)


# The live consumers' staging tables, made on a connection the first time it writes a batch; they last as
# long as the session. Each batch empties them first, in the same round trip: ON COMMIT DELETE ROWS
# truncated all five at every commit, which cost PostgreSQL ~3-4 ms a batch here (pgbench, five small
# tables: 5.9 ms a transaction against 1.9 ms emptied by DELETE). What a DELETE leaves behind is given
# back by a TRUNCATE instead once a connection has staged ``LIVE_STAGE_TRUNCATE_AFTER`` events since.
_LIVE_TABLES = ("replay_fresh", *STAGE_COLUMNS)
_LIVE_STAGE = "; ".join((fresh_stage("PRESERVE ROWS"), *stage_ddl("PRESERVE ROWS")))
_EMPTY_LIVE_STAGE = "; ".join((_LIVE_STAGE, *(f"DELETE FROM {table}" for table in _LIVE_TABLES)))
_TRUNCATE_LIVE_STAGE = "; ".join((_LIVE_STAGE, "TRUNCATE " + ", ".join(_LIVE_TABLES)))
LIVE_STAGE_TRUNCATE_AFTER = 1_024
_staged_since_truncate: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], int] = weakref.WeakKeyDictionary()


async def apply_batch(conn: psycopg.AsyncConnection, batch: Sequence[Tracked]) -> None:
    """``apply`` of each event of ``batch`` in turn (all of them new), written as the replay writes a poll."""
    staged = _staged_since_truncate.get(conn, 0)
    if staged >= LIVE_STAGE_TRUNCATE_AFTER:
        await conn.execute(_TRUNCATE_LIVE_STAGE)
        staged = 0
    else:
        await conn.execute(_EMPTY_LIVE_STAGE)
    _staged_since_truncate[conn] = staged + len(batch)
    await conn.execute("INSERT INTO replay_fresh (n) SELECT generate_series(0, %s)", (len(batch) - 1,))
    await StagedJournal(batch).write(conn, frozenset())


journal_batch: BatchHandler = batched(apply_batch)
"""The live consumer of the wallet events."""
rounds_batch: BatchHandler = batched(apply_batch, ROUND_EVENT_TYPES)
"""The live consumer of the table events: the round events only."""
