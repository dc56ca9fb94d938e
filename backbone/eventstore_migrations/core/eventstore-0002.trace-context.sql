-- depends: eventstore-0001.baseline
-- Expand only (docs/decisions/0012-versioned-migrations.md): a column older code ignores.
-- The trace of the command that appended an event (backbone/tracing.py): the transaction's
-- niuniu.trace_context setting, set only while tracing is on; the relay sends it as a header.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS trace_context TEXT
    DEFAULT nullif(current_setting('niuniu.trace_context', true), '');
