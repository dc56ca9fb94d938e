-- depends: 0001.baseline
-- Expand only (docs/decisions/0012-versioned-migrations.md): two additions older code ignores.
-- The trace of the command that appended an event (backbone/tracing.py): the transaction's
-- niuniu.trace_context setting, set only while tracing is on; the relay sends it as a header.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS trace_context TEXT
    DEFAULT nullif(current_setting('niuniu.trace_context', true), '');

-- How far the restore check has read this service's own topics (backbone/restorecheck.py).
CREATE TABLE IF NOT EXISTS topic_checkpoints (
    topic        TEXT NOT NULL,
    partition    INT NOT NULL,
    next_offset  BIGINT NOT NULL CHECK (next_offset >= 0),
    PRIMARY KEY (topic, partition)
);
