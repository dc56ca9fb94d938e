-- The wallet's database as the services created it at start-up before versioned migrations:
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

CREATE TABLE IF NOT EXISTS wallet_users (
    account_id     UUID PRIMARY KEY,
    username       TEXT NOT NULL UNIQUE,
    email          TEXT NOT NULL,
    password_hash  TEXT NOT NULL,
    role           TEXT NOT NULL CHECK (role IN ('player', 'admin', 'auditor', 'cashier')),
    request_id     TEXT UNIQUE,
    created_at     TIMESTAMPTZ NOT NULL
);

CREATE TABLE IF NOT EXISTS wallet_accounts (
    account          TEXT PRIMARY KEY,
    kind             TEXT NOT NULL CHECK (kind IN ('player', 'system', 'external')),
    available_minor  BIGINT NOT NULL DEFAULT 0,
    held_minor       BIGINT NOT NULL DEFAULT 0 CHECK (held_minor >= 0),
    version          BIGINT NOT NULL DEFAULT 0,
    CHECK (kind <> 'player' OR available_minor >= 0)
);

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
    resized_minor            BIGINT CHECK (resized_minor > 0)
);

DO $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conrelid = 'wallet_users'::regclass AND conname = 'wallet_users_role_check'
          AND pg_get_constraintdef(oid) NOT LIKE '%cashier%'
    ) THEN
        ALTER TABLE wallet_users DROP CONSTRAINT wallet_users_role_check;
        ALTER TABLE wallet_users ADD CONSTRAINT wallet_users_role_check
            CHECK (role IN ('player', 'admin', 'auditor', 'cashier'));
    END IF;
END
$$;

ALTER TABLE wallet_holds ADD COLUMN IF NOT EXISTS resized_minor BIGINT CHECK (resized_minor > 0);

CREATE INDEX IF NOT EXISTS wallet_holds_open_idx ON wallet_holds (expires_at) WHERE status = 'open';

CREATE INDEX IF NOT EXISTS wallet_holds_account_idx ON wallet_holds (account, seq);

CREATE TABLE IF NOT EXISTS wallet_hold_resizes (
    resize_id       TEXT PRIMARY KEY,
    hold_id         TEXT NOT NULL REFERENCES wallet_holds (hold_id),
    previous_minor  BIGINT NOT NULL CHECK (previous_minor > 0),
    amount_minor    BIGINT NOT NULL CHECK (amount_minor > 0),
    resized_at      TIMESTAMPTZ NOT NULL
);

CREATE INDEX IF NOT EXISTS wallet_hold_resizes_hold_idx ON wallet_hold_resizes (hold_id, resized_at);

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
);

CREATE INDEX IF NOT EXISTS wallet_entries_account_idx ON wallet_entries (account, entry_id);

CREATE INDEX IF NOT EXISTS wallet_entries_window_idx ON wallet_entries (account, source, occurred_at);

CREATE TABLE IF NOT EXISTS wallet_requests (
    request_key      TEXT PRIMARY KEY,
    fingerprint      TEXT NOT NULL,
    movement_id      TEXT NOT NULL,
    account          TEXT NOT NULL,
    available_minor  BIGINT NOT NULL,
    held_minor       BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS wallet_limits (
    account               TEXT NOT NULL,
    kind                  TEXT NOT NULL,
    value                 BIGINT NOT NULL,
    pending_value         BIGINT,
    pending_effective_at  TIMESTAMPTZ,
    PRIMARY KEY (account, kind)
);

CREATE TABLE IF NOT EXISTS wallet_exclusions (
    account    TEXT PRIMARY KEY,
    until      TIMESTAMPTZ,
    permanent  BOOLEAN NOT NULL
);

CREATE TABLE IF NOT EXISTS wallet_rounds (
    round_id    TEXT PRIMARY KEY,
    table_id    TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('settled', 'voided', 'rejected')),
    version     BIGINT NOT NULL,
    digest      TEXT NOT NULL,
    reason      TEXT NOT NULL,
    detail      TEXT NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL
);

CREATE INDEX IF NOT EXISTS wallet_rounds_rejected_idx ON wallet_rounds (round_id) WHERE status = 'rejected';

CREATE OR REPLACE FUNCTION wallet_require(ok BOOLEAN, message TEXT) RETURNS VOID LANGUAGE plpgsql AS $$
BEGIN
    IF NOT ok THEN
        RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = message;
    END IF;
END
$$;

INSERT INTO wallet_accounts (account, kind) VALUES
    ('house', 'system'),
    ('commission_revenue', 'system'),
    ('rebate_expense', 'system'),
    ('jackpot_pool', 'system'),
    ('fees', 'system'),
    ('external:cashier', 'external')
ON CONFLICT DO NOTHING;
