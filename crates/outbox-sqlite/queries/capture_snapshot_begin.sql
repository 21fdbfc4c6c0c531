-- `outbox capture snapshot` start of a new snapshot of capture ?1 (table ?2, key column ?3,
-- at ?4 Unix microseconds): no row yet, or the last one finished (a new snapshot starts
-- over), or it followed another table or key (the entry changed).
INSERT INTO {{name:_capture_snapshots}} (name, table_name, key_column, started_at)
VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (name) DO UPDATE
SET table_name = excluded.table_name, key_column = excluded.key_column, last_key = NULL,
    "rows" = 0, started_at = excluded.started_at, finished_at = NULL
