-- Records one [[subscription]] entry: a new row is active; an existing row keeps its state
-- and creation time and takes the file's filter and sink. ?1 name, ?2 filter JSON, ?3 sink,
-- ?4 now (Unix microseconds).
INSERT INTO {{name:_subscriptions}} (name, filter, sink, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?4)
ON CONFLICT (name) DO UPDATE
SET filter = excluded.filter, sink = excluded.sink, updated_at = excluded.updated_at
WHERE filter IS NOT excluded.filter OR sink IS NOT excluded.sink
