-- `outbox replay`: the ids of the selected events, in seq (commit) order, read once. The
-- batches then address rows by primary key, so each batch is a few index probes however
-- large the table is (seq has no index over delivered rows, and must not get one: it would
-- cost every delivery an index insert). 16 bytes per event in the caller's memory.
-- Polling mode selects delivered rows; CDC mode, which records no delivery per row, every
-- row that is not a dead letter. $1 since (created_at >=), $2 until (created_at <, NULL: no
-- bound), $3 aggregate_id or NULL, $4 event_type or NULL, $5 = true in CDC mode.
SELECT id
FROM {{table}}
WHERE CASE WHEN $5 THEN state = 'pending' ELSE state = 'delivered' END
  AND created_at >= $1
  AND ($2::timestamptz IS NULL OR created_at < $2)
  AND ($3::text IS NULL OR aggregate_id = $3)
  AND ($4::text IS NULL OR event_type = $4)
ORDER BY seq
