-- Records one [[subscription]] entry: a new row starts in state ?5 (active, or paused by
-- `outbox migrate --paused`); an existing row keeps its state and creation time and takes the
-- file's filter and sink. ?1 name, ?2 filter JSON, ?3 sink, ?4 now (Unix microseconds),
-- ?5 state of a new row.
INSERT INTO {{name:_subscriptions}} (name, filter, sink, state, created_at, updated_at)
VALUES (?1, ?2, ?3, ?5, ?4, ?4)
ON CONFLICT (name) DO UPDATE
SET filter = excluded.filter, sink = excluded.sink, updated_at = excluded.updated_at
WHERE filter IS NOT excluded.filter OR sink IS NOT excluded.sink
