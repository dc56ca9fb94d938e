-- depends: 0001.baseline
-- Expand only (docs/decisions/0012-versioned-migrations.md): an addition older code ignores.
-- (The outbox's trace context, released with this migration, is the event store's own
-- eventstore-0002.trace-context, in backbone/eventstore_migrations.)

-- How far the restore check has read this service's own topics (backbone/restorecheck.py).
CREATE TABLE IF NOT EXISTS topic_checkpoints (
    topic        TEXT NOT NULL,
    partition    INT NOT NULL,
    next_offset  BIGINT NOT NULL CHECK (next_offset >= 0),
    PRIMARY KEY (topic, partition)
);
