-- `outbox capture snapshot` start: the capture's ($1) recorded snapshot, locked until the
-- start's transaction ends: its table, key column, last key, rows, and whether it finished.
SELECT table_name, key_column, last_key::text, rows, finished_at IS NOT NULL
FROM {{qname:_capture_snapshots}}
WHERE name = $1
FOR UPDATE
