-- depends: eventstore-0001.baseline
-- For a database whose service reads a stream with the streams under it (backbone/eventreads.py,
-- the table's WatchTable): the events by stream prefix, in position order. The statement the
-- table's 0001.baseline ran before the store's schema moved here: a no-op where it did.
CREATE INDEX IF NOT EXISTS events_stream_prefix_idx ON events (stream_id text_pattern_ops, position);
