-- The ledger's database as the services created it at start-up before versioned migrations:
-- every statement is idempotent, so this baseline applies to an empty database and is a
-- no-op on one those start-ups made (docs/decisions/0012-versioned-migrations.md).

CREATE TABLE IF NOT EXISTS events (
    position        BIGINT PRIMARY KEY,
    event_id        UUID NOT NULL UNIQUE,
    stream_id       TEXT NOT NULL,
    version         BIGINT NOT NULL CHECK (version > 0),
    event_type      TEXT NOT NULL,
    correlation_id  TEXT NOT NULL,
    occurred_at     TIMESTAMPTZ NOT NULL,
    envelope        BYTEA NOT NULL,
    UNIQUE (stream_id, version)
);

CREATE SEQUENCE IF NOT EXISTS events_position_seq;

CREATE INDEX IF NOT EXISTS events_correlation_idx ON events (correlation_id);

CREATE TABLE IF NOT EXISTS outbox (
    position      BIGINT PRIMARY KEY REFERENCES events (position),
    topic         TEXT NOT NULL,
    record_key    TEXT NOT NULL,
    published_at  TIMESTAMPTZ,
    key_hash      INT CHECK (key_hash >= 0)
);

CREATE INDEX IF NOT EXISTS outbox_unpublished_idx ON outbox (position) WHERE published_at IS NULL;

ALTER TABLE outbox ADD COLUMN IF NOT EXISTS key_hash INT CHECK (key_hash >= 0);

CREATE OR REPLACE FUNCTION niuniu_append_events(
    p_stream TEXT, p_domain TEXT, p_expected BIGINT, p_ids UUID[], p_types TEXT[], p_correlations TEXT[],
    p_occurred TIMESTAMPTZ[], p_envelopes BYTEA[], p_topics TEXT[], p_key_hash INT
) RETURNS BIGINT[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    current_version BIGINT;
    positions BIGINT[];
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('niuniu.events.append'));
    PERFORM pg_advisory_xact_lock(28270, hashtext(p_domain));
    -- A new snapshot (READ COMMITTED): every append of this domain before ours has committed.
    SELECT coalesce(max(version), 0) INTO current_version FROM events WHERE stream_id = p_stream;
    IF current_version <> p_expected THEN
        RETURN NULL;
    END IF;
    WITH new_events AS (
        INSERT INTO events (position, event_id, stream_id, version, event_type, correlation_id, occurred_at, envelope)
        SELECT nextval('events_position_seq'), e.id, p_stream, p_expected + e.n, e.t, e.c, e.o, e.env
        FROM unnest(p_ids, p_types, p_correlations, p_occurred, p_envelopes) WITH ORDINALITY AS e (id, t, c, o, env, n)
        RETURNING position, version
    ), new_outbox AS (
        INSERT INTO outbox (position, topic, record_key, key_hash)
        SELECT position, p_topics[version - p_expected], p_stream, p_key_hash FROM new_events
    )
    SELECT array_agg(position ORDER BY version) INTO positions FROM new_events;
    RETURN positions;
END
$$;

CREATE OR REPLACE FUNCTION niuniu_append_events_strict(
    p_stream TEXT, p_domain TEXT, p_expected BIGINT, p_ids UUID[], p_types TEXT[], p_correlations TEXT[],
    p_occurred TIMESTAMPTZ[], p_envelopes BYTEA[], p_topics TEXT[], p_key_hash INT
) RETURNS BIGINT[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    positions BIGINT[];
BEGIN
    positions := niuniu_append_events(p_stream, p_domain, p_expected, p_ids, p_types, p_correlations, p_occurred,
                                      p_envelopes, p_topics, p_key_hash);
    IF positions IS NULL THEN
        RAISE EXCEPTION 'stream % is no longer at version %', p_stream, p_expected USING ERRCODE = '40001';
    END IF;
    RETURN positions;
END
$$;

CREATE OR REPLACE FUNCTION niuniu_append_event(
    p_stream TEXT, p_domain TEXT, p_expected BIGINT, p_id UUID, p_type TEXT, p_correlation TEXT,
    p_occurred TIMESTAMPTZ, p_envelope BYTEA, p_topic TEXT, p_key_hash INT
) RETURNS BIGINT LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    new_position BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('niuniu.events.append'));
    PERFORM pg_advisory_xact_lock(28270, hashtext(p_domain));
    -- A new snapshot (READ COMMITTED): every append of this domain before ours has committed.
    IF coalesce((SELECT max(version) FROM events WHERE stream_id = p_stream), 0) <> p_expected THEN
        RETURN NULL;
    END IF;
    INSERT INTO events (position, event_id, stream_id, version, event_type, correlation_id, occurred_at, envelope)
    VALUES (nextval('events_position_seq'), p_id, p_stream, p_expected + 1, p_type, p_correlation, p_occurred,
            p_envelope)
    RETURNING position INTO new_position;
    INSERT INTO outbox (position, topic, record_key, key_hash) VALUES (new_position, p_topic, p_stream, p_key_hash);
    RETURN new_position;
END
$$;

CREATE OR REPLACE FUNCTION niuniu_append_event_strict(
    p_stream TEXT, p_domain TEXT, p_expected BIGINT, p_id UUID, p_type TEXT, p_correlation TEXT,
    p_occurred TIMESTAMPTZ, p_envelope BYTEA, p_topic TEXT, p_key_hash INT
) RETURNS BIGINT[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    new_position BIGINT;
BEGIN
    new_position := niuniu_append_event(p_stream, p_domain, p_expected, p_id, p_type, p_correlation, p_occurred,
                                        p_envelope, p_topic, p_key_hash);
    IF new_position IS NULL THEN
        RAISE EXCEPTION 'stream % is no longer at version %', p_stream, p_expected USING ERRCODE = '40001';
    END IF;
    RETURN ARRAY[new_position];
END
$$;

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
