-- `outbox capture snapshot` start of a new snapshot of capture ? (table ?, key column ?): no
-- row yet, or the last one finished (a new snapshot starts over), or it followed another
-- table or key (the entry changed).
INSERT INTO {{name:_capture_snapshots}} (name, table_name, key_column)
VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE table_name = VALUES(table_name), key_column = VALUES(key_column),
    last_key = NULL, `rows` = 0, started_at = CURRENT_TIMESTAMP(6), finished_at = NULL
