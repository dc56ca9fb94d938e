-- The table's database as the services created it at start-up before versioned migrations:
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

CREATE TABLE IF NOT EXISTS tables (
    table_id          TEXT PRIMARY KEY,
    variant           TEXT NOT NULL,
    config            JSONB NOT NULL,
    limits            BYTEA NOT NULL,
    config_version    INT NOT NULL,
    round_no          BIGINT NOT NULL DEFAULT 0,
    current_round_id  TEXT,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS rounds (
    round_id           TEXT PRIMARY KEY,
    table_id           TEXT NOT NULL REFERENCES tables (table_id),
    round_no           BIGINT NOT NULL,
    phase              TEXT NOT NULL,
    commitment         TEXT NOT NULL,
    config             JSONB NOT NULL,
    limits             BYTEA NOT NULL,
    config_version     INT NOT NULL,
    betting_closes_at  TIMESTAMPTZ NOT NULL,
    next_step_at       TIMESTAMPTZ,
    reveals_done       INT NOT NULL DEFAULT 0,
    deck               TEXT[],
    client_seed        TEXT NOT NULL DEFAULT '',
    server_seed        TEXT,
    void_reason        TEXT,
    fencing_token      BIGINT NOT NULL DEFAULT 0,
    opened_at          TIMESTAMPTZ NOT NULL,
    ended_at           TIMESTAMPTZ,
    UNIQUE (table_id, round_no)
);

CREATE TABLE IF NOT EXISTS bets (
    bet_id       TEXT PRIMARY KEY,
    round_id     TEXT NOT NULL REFERENCES rounds (round_id),
    table_id     TEXT NOT NULL,
    player       TEXT NOT NULL,
    area         TEXT NOT NULL,
    stake_minor  BIGINT NOT NULL CHECK (stake_minor > 0),
    hold_minor   BIGINT NOT NULL CHECK (hold_minor >= stake_minor),
    hold_id      TEXT NOT NULL UNIQUE,
    status       TEXT NOT NULL,
    outcome      TEXT,
    net_minor    BIGINT,
    placed_at    TIMESTAMPTZ NOT NULL
);

CREATE INDEX IF NOT EXISTS bets_round_idx ON bets (round_id, player);

CREATE TABLE IF NOT EXISTS round_bet_counts (
    round_id  TEXT PRIMARY KEY REFERENCES rounds (round_id),
    bets      INT NOT NULL CHECK (bets > 0)
);

CREATE TABLE IF NOT EXISTS seats (
    table_id   TEXT NOT NULL REFERENCES tables (table_id),
    player     TEXT NOT NULL,
    joined_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (table_id, player)
);

CREATE INDEX IF NOT EXISTS events_stream_prefix_idx ON events (stream_id text_pattern_ops, position);

CREATE TABLE IF NOT EXISTS jackpot_claims (
    round_id          TEXT PRIMARY KEY,
    table_id          TEXT NOT NULL,
    pool_delta_minor  BIGINT NOT NULL CHECK (pool_delta_minor < 0),
    payable_minor     BIGINT NOT NULL CHECK (payable_minor >= 0),
    status            TEXT NOT NULL DEFAULT 'in_flight',
    claimed_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS jackpot_claims_in_flight_idx ON jackpot_claims (claimed_at) WHERE status = 'in_flight';

CREATE TABLE IF NOT EXISTS banker_seats (
    table_id        TEXT PRIMARY KEY REFERENCES tables (table_id),
    player          TEXT,
    capital_minor   BIGINT NOT NULL DEFAULT 0,
    rounds_banked   INT NOT NULL DEFAULT 0,
    leaving         BOOLEAN NOT NULL DEFAULT false
);

CREATE TABLE IF NOT EXISTS banker_queue (
    table_id       TEXT NOT NULL REFERENCES tables (table_id),
    player         TEXT NOT NULL,
    capital_minor  BIGINT NOT NULL CHECK (capital_minor >= 0),
    seq            BIGSERIAL,
    applied_at     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (table_id, player)
);

CREATE INDEX IF NOT EXISTS banker_queue_order_idx ON banker_queue (table_id, seq);

CREATE TABLE IF NOT EXISTS banked_rounds (
    round_id          TEXT PRIMARY KEY,
    table_id          TEXT NOT NULL REFERENCES tables (table_id),
    banker            TEXT,
    capital_minor     BIGINT NOT NULL CHECK (capital_minor >= 0),
    hold_id           TEXT,
    hold_expires_at   TIMESTAMPTZ,
    table_cap_minor   BIGINT NOT NULL CHECK (table_cap_minor >= 0),
    staked_minor      BIGINT NOT NULL DEFAULT 0,
    CHECK (staked_minor >= 0 AND staked_minor <= table_cap_minor)
);

CREATE TABLE IF NOT EXISTS envelope_rounds (
    round_id           TEXT PRIMARY KEY,
    table_id           TEXT NOT NULL REFERENCES tables (table_id),
    bidding_closes_at  TIMESTAMPTZ NOT NULL,
    leading_bid_id     TEXT,
    highest_bid_minor  BIGINT NOT NULL DEFAULT 0,
    dealer             TEXT,
    dealer_pool_minor  BIGINT,
    dealer_hold_id     TEXT,
    dealer_hold_minor  BIGINT,
    redeal_of          TEXT,
    redeal             BOOLEAN NOT NULL DEFAULT false
);

CREATE TABLE IF NOT EXISTS envelope_bids (
    bid_id        TEXT PRIMARY KEY,
    round_id      TEXT NOT NULL REFERENCES envelope_rounds (round_id),
    player        TEXT NOT NULL,
    amount_minor  BIGINT NOT NULL CHECK (amount_minor > 0),
    hold_id       TEXT NOT NULL UNIQUE,
    hold_minor    BIGINT NOT NULL,
    status        TEXT NOT NULL,
    placed_at     TIMESTAMPTZ NOT NULL
);

CREATE INDEX IF NOT EXISTS envelope_bids_round_idx ON envelope_bids (round_id);

CREATE TABLE IF NOT EXISTS envelope_grabs (
    round_id      TEXT NOT NULL REFERENCES envelope_rounds (round_id),
    grab_no       INT NOT NULL,
    position      INT NOT NULL,
    participant   TEXT NOT NULL,
    bet_id        TEXT,
    amount_minor  BIGINT NOT NULL CHECK (amount_minor > 0),
    PRIMARY KEY (round_id, grab_no)
);

CREATE TABLE IF NOT EXISTS bet_changes (
    change_id     TEXT PRIMARY KEY,
    bet_id        TEXT NOT NULL REFERENCES bets (bet_id),
    stake_minor   BIGINT NOT NULL,
    changed_at    TIMESTAMPTZ NOT NULL
);

CREATE UNIQUE INDEX IF NOT EXISTS bets_one_envelope_bet_idx ON bets (round_id, player) WHERE status = 'placed' AND area = 'dealer';

ALTER TABLE bets ADD COLUMN IF NOT EXISTS client_seed TEXT NOT NULL DEFAULT '';

ALTER TABLE tables ADD COLUMN IF NOT EXISTS closing_at TIMESTAMPTZ;

ALTER TABLE tables ADD COLUMN IF NOT EXISTS closed_at TIMESTAMPTZ;
