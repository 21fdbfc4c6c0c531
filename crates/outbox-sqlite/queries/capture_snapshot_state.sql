-- `outbox capture snapshot` start, in its BEGIN IMMEDIATE transaction: the capture's ($1)
-- recorded snapshot: its table, key column, the storage class and value of its last key,
-- rows, and whether it finished.
SELECT table_name, key_column, typeof(last_key), last_key, "rows", finished_at IS NOT NULL
FROM {{name:_capture_snapshots}}
WHERE name = ?1
