-- The rng's database as the services created it at start-up before versioned migrations:
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
);

CREATE TABLE IF NOT EXISTS rng_test_decks (
    round_id  TEXT PRIMARY KEY,
    cards     TEXT[] NOT NULL,
    set_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS rng_test_envelopes (
    round_id    TEXT PRIMARY KEY,
    amounts     BIGINT[] NOT NULL,
    grab_order  INT[] NOT NULL,
    set_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

ALTER TABLE rng_rounds ADD COLUMN IF NOT EXISTS client_seeds TEXT[];

ALTER TABLE rng_rounds ADD COLUMN IF NOT EXISTS envelope_client_seeds TEXT[];
