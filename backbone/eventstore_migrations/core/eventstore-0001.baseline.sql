-- The event store (backbone/eventstore.py): its events, their outbox, the position sequence,
-- their indexes and the append functions, in every service database. This is backbone's own
-- schema: the services' migrations never name these tables. The statements are the ones each
-- service's 0001.baseline ran before the store's schema moved here, all idempotent, so this
-- migration creates the store in an empty database and changes nothing in one those baselines
-- (or the start-ups before them) made (docs/decisions/0012-versioned-migrations.md).

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
