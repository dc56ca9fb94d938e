-- The ledger's database as the services created it at start-up before versioned migrations:
-- every statement is idempotent, so this baseline applies to an empty database and is a
-- no-op on one those start-ups made (docs/decisions/0012-versioned-migrations.md).
-- The event store's tables, sequence, indexes and append functions are backbone's own migrations
-- (backbone/eventstore_migrations), which niuniu-migrate applies before these.
-- depends: eventstore-0001.baseline

CREATE TABLE IF NOT EXISTS consumer_positions (
    consumer     TEXT NOT NULL,
    topic        TEXT NOT NULL,
    partition    INT NOT NULL,
    next_offset  BIGINT NOT NULL,
    PRIMARY KEY (consumer, topic, partition)
);

CREATE TABLE IF NOT EXISTS processed_events (
    consumer    TEXT NOT NULL,
    event_id    UUID NOT NULL,
    topic       TEXT NOT NULL,
    partition   INT NOT NULL,
    "offset"    BIGINT NOT NULL,
    applied_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

CREATE TABLE IF NOT EXISTS lease_fences (
    name   TEXT PRIMARY KEY,
    token  BIGINT NOT NULL CHECK (token > 0)
);

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
);

CREATE INDEX IF NOT EXISTS journal_entries_round_idx ON journal_entries (round_id);

CREATE INDEX IF NOT EXISTS journal_entries_hold_idx ON journal_entries (hold_id) WHERE hold_id <> '';

CREATE INDEX IF NOT EXISTS journal_entries_time_idx ON journal_entries (occurred_at);

CREATE INDEX IF NOT EXISTS journal_entries_position_idx ON journal_entries (wallet_position);

CREATE TABLE IF NOT EXISTS journal_lines (
    entry_id      TEXT NOT NULL REFERENCES journal_entries (entry_id),
    line_no       INT NOT NULL,
    account       TEXT NOT NULL,
    bucket        TEXT NOT NULL CHECK (bucket IN ('available', 'held')),
    debit_minor   BIGINT NOT NULL CHECK (debit_minor >= 0),
    credit_minor  BIGINT NOT NULL CHECK (credit_minor >= 0),
    PRIMARY KEY (entry_id, line_no),
    CHECK ((debit_minor = 0) <> (credit_minor = 0))
);

CREATE INDEX IF NOT EXISTS journal_lines_account_idx ON journal_lines (account, entry_id);

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
);

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
);

CREATE INDEX IF NOT EXISTS journal_rejects_round_idx ON journal_rejects (round_id);

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
);

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
);

CREATE OR REPLACE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger journal is append-only: % on % is forbidden', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END
$$;

CREATE OR REPLACE TRIGGER journal_entries_append_only BEFORE UPDATE OR DELETE ON journal_entries FOR EACH ROW EXECUTE FUNCTION ledger_append_only();

CREATE OR REPLACE TRIGGER journal_entries_no_truncate BEFORE TRUNCATE ON journal_entries FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

CREATE OR REPLACE TRIGGER journal_lines_append_only BEFORE UPDATE OR DELETE ON journal_lines FOR EACH ROW EXECUTE FUNCTION ledger_append_only();

CREATE OR REPLACE TRIGGER journal_lines_no_truncate BEFORE TRUNCATE ON journal_lines FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

CREATE OR REPLACE TRIGGER journal_rejects_append_only BEFORE UPDATE OR DELETE ON journal_rejects FOR EACH ROW EXECUTE FUNCTION ledger_append_only();

CREATE OR REPLACE TRIGGER journal_rejects_no_truncate BEFORE TRUNCATE ON journal_rejects FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();
