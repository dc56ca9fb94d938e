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
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import psycopg
from niuniu.table.v1 import events_pb2 as table_pb2
from niuniu.v1 import events_pb2
from psycopg import sql

from backbone.consumer import BatchHandler, Tracked, batched
from backbone.replay.model import Projection, copy_text, fresh_stage
from services.ledger import metrics
from services.ledger.accounts import account_type
from services.ledger.journal import Entry, Reason, Rejected, journal_event, journal_rows

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

ROUND_SETTLED = table_pb2.RoundSettled.DESCRIPTOR
ROUND_VOIDED = table_pb2.RoundVoided.DESCRIPTOR
# The table events the projection acts on (the round index). The live rounds consumer skips the
# others (bets, reveals: nothing in them to journal or index) without a transaction or tracking row.
ROUND_EVENT_TYPES = ("table.round_settled", "table.round_voided")


@dataclass(frozen=True, slots=True)
class Position:
    topic: str
    partition: int
    offset: int
    wallet_position: int


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
            await _reject(conn, envelope, position, reject)


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


def _move_balances(changes: str) -> str:
    """The one statement that moves the balances: ``changes`` selects (account, bucket, account type, debit,
    credit, balance change, lines) once per (account, bucket), in that order (so that two writers lock the
    rows in one order); each is added to its balance row, created at its first line."""
    return (
        "INSERT INTO balances (account, bucket, account_type, debit_minor, credit_minor, balance_minor, lines) "
        + changes
        + " ON CONFLICT (account, bucket) DO UPDATE SET"
        " debit_minor = balances.debit_minor + EXCLUDED.debit_minor,"
        " credit_minor = balances.credit_minor + EXCLUDED.credit_minor,"
        " balance_minor = balances.balance_minor + EXCLUDED.balance_minor,"
        " lines = balances.lines + EXCLUDED.lines"
    )


# The balance changes of the lines a statement inserted (its ``lines`` CTE).
_MOVE_BALANCES_BY_LINES = _move_balances(
    "SELECT account, bucket, min(account_type), sum(debit_minor), sum(credit_minor), sum(credit_minor - debit_minor),"
    " count(*) FROM lines GROUP BY account, bucket ORDER BY account, bucket"
)


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
{_MOVE_BALANCES_BY_LINES}
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


# The replay's path (``stage_journal``): a whole poll is turned into rows on the replay's worker
# thread and staged with COPY (temporary tables, emptied at commit); a few statements then write
# the rows of the poll's fresh events (``replay_fresh``): the same effects as the one-event
# statements applied event after event. Rows are inserted in poll order, so an entry id repeated
# across events is kept from its first event (the others become rejects, as one by one), and a
# round indexed twice keeps its first outcome; lines, balance changes and round bets only follow
# the rows inserted. Times travel as microseconds since the epoch (what ``ToDatetime`` keeps).
_STAGE_COLUMNS = {
    "stage_entries": "(pn INT, n INT, entry_id TEXT, movement_index INT, kind TEXT, round_id TEXT, hold_id TEXT,"
    ' bet_id TEXT, event_id UUID, event_type TEXT, occurred_us BIGINT, topic TEXT, partition INT, "offset" BIGINT,'
    " wallet_position BIGINT)",
    "stage_lines": "(n INT, line_no INT, bucket TEXT, debit_minor BIGINT, credit_minor BIGINT, account TEXT,"
    " account_type SMALLINT)",
    "stage_rounds": "(pn INT, n INT, round_id TEXT, table_id TEXT, variant TEXT, status TEXT, event_id UUID,"
    " occurred_us BIGINT, bets INT, transfers INT, event BYTEA)",
    "stage_round_bets": "(rn INT, bet_id TEXT, player TEXT, area TEXT, stake_minor BIGINT, outcome TEXT,"
    " net_minor BIGINT, hold_id TEXT)",
}


def _stage_ddl(on_commit: str) -> tuple[str, ...]:
    return tuple(
        f"CREATE TEMP TABLE IF NOT EXISTS {table} {columns} ON COMMIT {on_commit}"
        for table, columns in _STAGE_COLUMNS.items()
    )


STAGE_DDL = _stage_ddl("DELETE ROWS")

_EPOCH_PLUS_US = "'epoch'::timestamptz + occurred_us * interval '1 microsecond'"

_WRITE_STAGED_ENTRIES = f"""
WITH fresh AS MATERIALIZED (
    SELECT * FROM stage_entries WHERE pn IN (SELECT n FROM replay_fresh)
), new_entries AS (
    INSERT INTO journal_entries (entry_id, event_id, movement_index, event_type, kind, round_id, hold_id, bet_id,
                                 occurred_at, topic, partition, "offset", wallet_position)
    SELECT entry_id, event_id, movement_index, event_type, kind, round_id, hold_id, bet_id, {_EPOCH_PLUS_US}, topic,
           partition, "offset", wallet_position
    FROM fresh ORDER BY n
    ON CONFLICT DO NOTHING
    RETURNING event_id, movement_index
), inserted AS MATERIALIZED (
    SELECT f.n, f.entry_id FROM fresh f JOIN new_entries USING (event_id, movement_index)
), lines AS (
    SELECT i.entry_id, l.line_no, l.account, l.bucket, l.account_type, l.debit_minor, l.credit_minor
    FROM stage_lines l JOIN inserted i USING (n)
), new_lines AS (
    INSERT INTO journal_lines (entry_id, line_no, account, bucket, debit_minor, credit_minor)
    SELECT entry_id, line_no, account, bucket, debit_minor, credit_minor FROM lines
), moved AS (
{_MOVE_BALANCES_BY_LINES}
)
SELECT f.pn, f.movement_index, f.entry_id FROM fresh f WHERE f.n NOT IN (SELECT n FROM inserted)
UNION ALL
SELECT -1, count(*)::int, '' FROM inserted
"""

_WRITE_STAGED_ROUNDS = f"""
WITH fresh AS MATERIALIZED (
    SELECT * FROM stage_rounds WHERE pn IN (SELECT n FROM replay_fresh)
), new_rounds AS (
    INSERT INTO rounds (round_id, table_id, variant, status, event_id, occurred_at, bets, transfers, event)
    SELECT round_id, table_id, variant, status, event_id, {_EPOCH_PLUS_US}, bets, transfers, event
    FROM fresh ORDER BY n
    ON CONFLICT (round_id) DO NOTHING
    RETURNING round_id, event_id
), kept AS MATERIALIZED (
    SELECT f.n FROM fresh f JOIN new_rounds USING (round_id, event_id)
), new_bets AS (
    INSERT INTO round_bets (round_id, bet_id, player, area, stake_minor, outcome, net_minor, hold_id)
    SELECT f.round_id, b.bet_id, b.player, b.area, b.stake_minor, b.outcome, b.net_minor, b.hold_id
    FROM stage_round_bets b JOIN kept k ON k.n = b.rn JOIN fresh f ON f.n = b.rn
    ON CONFLICT DO NOTHING
)
SELECT f.round_id, f.event_id::text FROM fresh f WHERE f.n NOT IN (SELECT n FROM kept)
"""

# The replay's first try at a poll whose events are all new (``StagedJournal.write_all_new``): the journal's
# rows copied straight into their tables (the entries in poll order, so ``seq`` follows it), each poll's
# balance changes summed on the worker thread and added in one statement, and the rounds' rows inserted
# without ON CONFLICT or the joins that find what was inserted. A row there already (an entry id journaled
# from another event, a round indexed twice, a bet twice in one round) fails it with a unique violation;
# the replay then undoes it and writes the poll with the two statements above. At 200 000 events
# (``niuniu-audit bench-replay``) those two took 2.9 and 0.7 s of a 9 s replay, and the copies into the
# stage 1.1 s more.
_COPY_ENTRIES = (
    "COPY journal_entries (entry_id, movement_index, kind, round_id, hold_id, bet_id, event_id, event_type,"
    ' occurred_at, topic, partition, "offset", wallet_position) FROM STDIN'
)
_COPY_LINES = "COPY journal_lines (entry_id, line_no, bucket, debit_minor, credit_minor, account) FROM STDIN"
_ADD_BALANCES = _move_balances(
    "SELECT a, b, t, d, c, c - d, n"
    " FROM unnest(%b::text[], %b::text[], %b::smallint[], %b::bigint[], %b::bigint[], %b::bigint[])"
    " AS m (a, b, t, d, c, n) ORDER BY a, b"
)

_WRITE_NEW_ROUNDS = f"""
WITH new_rounds AS (
    INSERT INTO rounds (round_id, table_id, variant, status, event_id, occurred_at, bets, transfers, event)
    SELECT round_id, table_id, variant, status, event_id, {_EPOCH_PLUS_US}, bets, transfers, event
    FROM stage_rounds ORDER BY n
)
INSERT INTO round_bets (round_id, bet_id, player, area, stake_minor, outcome, net_minor, hold_id)
SELECT r.round_id, b.bet_id, b.player, b.area, b.stake_minor, b.outcome, b.net_minor, b.hold_id
FROM stage_round_bets b JOIN stage_rounds r ON r.n = b.rn
"""

# Account name -> its COPY field, and its fields "account<TAB>account_type" (the type follows from the name).
_account_fields: dict[str, tuple[str, str]] = {}
MAX_CACHED_ACCOUNTS = 100_000
# Tabs between the six fields of an entry when none of them holds one.
ENTRY_TABS = 5


def _fields_of(account: str) -> tuple[str, str]:
    text = copy_text(account)
    fields = (text, f"{text}\t{int(account_type(account))}")
    if len(_account_fields) < MAX_CACHED_ACCOUNTS:
        _account_fields[account] = fields
    return fields


def _micros(envelope: events_pb2.EventEnvelope) -> int:
    """``occurred_at`` in microseconds since the epoch (``ToDatetime``'s precision)."""
    at = envelope.occurred_at
    return int(at.seconds) * 1_000_000 + int(at.nanos) // 1_000


# Whole seconds since the epoch -> "YYYY-MM-DD HH:MM:SS" (UTC), for the last few seconds seen.
_second_texts: dict[int, str] = {}
MAX_CACHED_SECONDS = 4_096


def _timestamp_text(envelope: events_pb2.EventEnvelope) -> str:
    """``occurred_at`` as a timestamptz in COPY text, to the microsecond (what ``_micros`` keeps)."""
    seconds, micros = divmod(_micros(envelope), 1_000_000)
    text = _second_texts.get(seconds)
    if text is None:
        t = time.gmtime(seconds)
        text = f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
        if len(_second_texts) >= MAX_CACHED_SECONDS:
            _second_texts.clear()
        _second_texts[seconds] = text
    return f"{text}.{micros:06d}+00"


class StagedJournal:
    """A poll of the journal's topics as COPY rows, written by ``write`` (the careful way, through the
    stage) or, built ``direct`` (``stage_journal``, the replay's stager), by ``write_all_new`` (straight
    into the journal's tables). Either method of an instance built the other way builds its rows first."""

    __slots__ = ("_balances", "_batch", "_bets", "_direct", "_entries", "_entry_count", "_lines", "_rejects", "_rounds")

    def __init__(self, batch: Sequence[Tracked], *, direct: bool = False) -> None:
        self._batch = batch
        self._direct = direct
        entries: list[str] = []
        lines: list[str] = []
        rounds: list[str] = []
        bets: list[str] = []
        # Direct: the poll's balance changes, (account, bucket) -> [debit, credit, lines].
        balances: dict[tuple[str, str], list[int]] = {}
        # Per event index: the rejects known before writing (refused movements, ids repeated within it).
        self._rejects: dict[int, list[Rejected]] = {}
        is_round: dict[str, bool] = {}  # per type url: ``payload.Is`` RoundSettled or RoundVoided
        for pn, tracked in enumerate(batch):
            envelope = tracked.envelope
            type_url = envelope.payload.type_url
            round_event = is_round.get(type_url)
            if round_event is None:
                round_event = is_round[type_url] = envelope.payload.Is(ROUND_SETTLED) or envelope.payload.Is(
                    ROUND_VOIDED
                )
            if round_event:
                row, round_bets = _round_rows(envelope)
                rn = len(rounds)
                round_id, table_id, variant, status, event_id, _, n_bets, n_transfers, event = row
                rounds.append(
                    f"{pn}\t{rn}\t{copy_text(round_id)}\t{copy_text(table_id)}\t{copy_text(variant)}\t{status}"
                    f"\t{copy_text(event_id)}\t{_micros(envelope)}\t{n_bets}\t{n_transfers}\t\\\\x{event.hex()}\n"
                )
                bets.extend(
                    f"{rn}\t{copy_text(bet_id)}\t{copy_text(player)}\t{copy_text(area)}\t{stake}"
                    f"\t{copy_text(outcome)}\t{net}\t{copy_text(hold_id)}\n"
                    for _, bet_id, player, area, stake, outcome, net, hold_id in round_bets
                )
                continue
            rows, rejected = journal_rows(envelope)
            if not rows and not rejected:
                continue
            seen: set[str] = set()
            event = (
                f"{copy_text(envelope.event_id)}\t{copy_text(envelope.event_type)}"
                f"\t{_timestamp_text(envelope) if direct else _micros(envelope)}"
                f"\t{copy_text(tracked.topic)}\t{tracked.partition}\t{tracked.offset}\t{envelope.store_position}\n"
            )
            for entry_id, index, kind, round_id, hold_id, bet_id, entry_lines in rows:
                if entry_id in seen:
                    rejected.append(
                        Rejected(index, entry_id, Reason.DUPLICATE_ENTRY_ID, "the event repeats this movement id")
                    )
                    continue
                seen.add(entry_id)
                n = len(entries)
                text = f"{entry_id}\t{index}\t{kind}\t{round_id}\t{hold_id}\t{bet_id}"
                entry = entry_id
                if text.count("\t") != ENTRY_TABS or "\\" in text or "\n" in text or "\r" in text:
                    text = "\t".join(copy_text(str(v)) for v in (entry_id, index, kind, round_id, hold_id, bet_id))
                    entry = copy_text(entry_id)
                if not direct:
                    entries.append(f"{pn}\t{n}\t{text}\t{event}")
                    for no, (account, bucket, debit, credit) in enumerate(entry_lines):
                        fields = _account_fields.get(account) or _fields_of(account)
                        lines.append(f"{n}\t{no}\t{bucket}\t{debit}\t{credit}\t{fields[1]}\n")
                    continue
                entries.append(f"{text}\t{event}")
                for no, (account, bucket, debit, credit) in enumerate(entry_lines):
                    fields = _account_fields.get(account) or _fields_of(account)
                    lines.append(f"{entry}\t{no}\t{bucket}\t{debit}\t{credit}\t{fields[0]}\n")
                    moved = balances.get((account, bucket))
                    if moved is None:
                        balances[account, bucket] = [debit, credit, 1]
                    else:
                        moved[0] += debit
                        moved[1] += credit
                        moved[2] += 1
            if rejected:
                self._rejects[pn] = rejected
        self._entry_count = len(entries)
        self._entries = "".join(entries).encode()
        self._lines = "".join(lines).encode()
        self._rounds = "".join(rounds).encode()
        self._bets = "".join(bets).encode()
        self._balances = balances

    async def write_all_new(self, conn: psycopg.AsyncConnection) -> None:
        if not self._direct:
            await StagedJournal(self._batch, direct=True).write_all_new(conn)
            return
        async with conn.cursor() as cur:
            if self._rounds:
                await _copy(cur, "stage_rounds", self._rounds)
                await _copy(cur, "stage_round_bets", self._bets)
                await cur.execute(_WRITE_NEW_ROUNDS)
            if self._entries:
                await _copy_into(cur, _COPY_ENTRIES, self._entries)
                await _copy_into(cur, _COPY_LINES, self._lines)
                moved = list(self._balances.items())
                await cur.execute(
                    _ADD_BALANCES,
                    (
                        [account for (account, _), _ in moved],
                        [bucket for (_, bucket), _ in moved],
                        [int(account_type(account)) for (account, _), _ in moved],
                        [debit for _, (debit, _, _) in moved],
                        [credit for _, (_, credit, _) in moved],
                        [count for _, (_, _, count) in moved],
                    ),
                )
                metrics.ENTRIES_JOURNALED.inc(self._entry_count)
        await self._write_rejects(conn, {pn: list(found) for pn, found in self._rejects.items()})

    async def write(self, conn: psycopg.AsyncConnection, stale: frozenset[int]) -> None:
        if self._direct:
            await StagedJournal(self._batch).write(conn, stale)
            return
        async with conn.cursor() as cur:
            if self._rounds:
                await _copy(cur, "stage_rounds", self._rounds)
                await _copy(cur, "stage_round_bets", self._bets)
                await cur.execute(_WRITE_STAGED_ROUNDS)
                for round_id, event_id in await cur.fetchall():
                    log.warning(
                        "round already indexed; keeping the first outcome",
                        extra={"round_id": round_id, "event_id": event_id},
                    )
            rejects = {pn: list(found) for pn, found in self._rejects.items() if pn not in stale}
            if self._entries:
                await _copy(cur, "stage_entries", self._entries)
                await _copy(cur, "stage_lines", self._lines)
                await cur.execute(_WRITE_STAGED_ENTRIES)
                for pn, index, entry_id in await cur.fetchall():
                    if pn < 0:
                        metrics.ENTRIES_JOURNALED.inc(index)
                        continue
                    rejects.setdefault(pn, []).append(
                        Rejected(index, entry_id, Reason.DUPLICATE_ENTRY_ID, "already journaled from another event")
                    )
        await self._write_rejects(conn, rejects)

    async def _write_rejects(self, conn: psycopg.AsyncConnection, rejects: dict[int, list[Rejected]]) -> None:
        for pn in sorted(rejects):
            tracked = self._batch[pn]
            position = Position(tracked.topic, tracked.partition, tracked.offset, tracked.envelope.store_position)
            for reject in sorted(rejects[pn], key=lambda r: r.movement_index):
                await _reject(conn, tracked.envelope, position, reject)


async def _copy(cur: psycopg.AsyncCursor[Any], table: str, rows: bytes) -> None:
    await _copy_into(cur, sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(table)), rows)


async def _copy_into(cur: psycopg.AsyncCursor[Any], statement: str | sql.Composed, rows: bytes) -> None:
    async with cur.copy(statement) as copy:
        await copy.write(rows)


def stage_journal(batch: Sequence[Tracked]) -> StagedJournal:
    """The replay's stager: the poll's rows, ready to COPY into the journal (pure, no I/O)."""
    return StagedJournal(batch, direct=True)


async def _reject(
    conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope, position: Position, rejected: Rejected
) -> None:
    log.error(
        "journal refused a movement",
        extra={
            "event_id": envelope.event_id,
            "entry_id": rejected.entry_id,
            "reason": rejected.reason,
            "detail": rejected.detail,
        },
    )
    await conn.execute(
        "INSERT INTO journal_rejects (event_id, movement_index, entry_id, event_type, round_id, reason, detail,"
        ' movement, occurred_at, topic, partition, "offset", wallet_position)'
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (
            envelope.event_id,
            rejected.movement_index,
            rejected.entry_id,
            envelope.event_type,
            envelope.correlation_id,
            rejected.reason,
            rejected.detail,
            rejected.movement,
            envelope.occurred_at.ToDatetime(tzinfo=UTC),
            position.topic,
            position.partition,
            position.offset,
            position.wallet_position,
        ),
    )
    metrics.REJECTS.labels(rejected.reason).inc()


def _round_rows(envelope: events_pb2.EventEnvelope) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """The ``rounds`` row (round_id, table_id, variant, status, event_id, occurred_at, bets, transfers, event)
    and the ``round_bets`` rows of a RoundSettled or RoundVoided envelope."""
    occurred_at = envelope.occurred_at.ToDatetime(tzinfo=UTC)
    if envelope.payload.Is(ROUND_SETTLED):
        settled = table_pb2.RoundSettled()
        envelope.payload.Unpack(settled)
        round_id = settled.round_id or envelope.correlation_id
        row = (
            round_id,
            settled.table_id,
            settled.variant,
            "settled",
            envelope.event_id,
            occurred_at,
            len(settled.bets),
            len(settled.transfers),
            settled.SerializeToString(),
        )
        bets = [
            (round_id, b.bet_id, b.player, b.area, b.stake_minor, b.outcome, b.net_minor, b.hold_id)
            for b in settled.bets
        ]
        return row, bets
    voided = table_pb2.RoundVoided()
    envelope.payload.Unpack(voided)
    row = (
        voided.round_id or envelope.correlation_id,
        voided.table_id,
        "",
        "voided",
        envelope.event_id,
        occurred_at,
        0,
        0,
        voided.SerializeToString(),
    )
    return row, []


async def _index_round(conn: psycopg.AsyncConnection, envelope: events_pb2.EventEnvelope) -> None:
    row, bets = _round_rows(envelope)
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
_LIVE_TABLES = ("replay_fresh", *_STAGE_COLUMNS)
_LIVE_STAGE = "; ".join((fresh_stage("PRESERVE ROWS"), *_stage_ddl("PRESERVE ROWS")))
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
