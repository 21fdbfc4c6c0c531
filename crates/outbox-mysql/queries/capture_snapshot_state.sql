-- `outbox capture snapshot` start: the capture's (?) recorded snapshot, locked until the
-- start's transaction ends: its table, key column, last key, rows, and whether it finished.
SELECT table_name, key_column, last_key, `rows`, finished_at IS NOT NULL
FROM {{name:_capture_snapshots}}
WHERE name = ?
FOR UPDATE
