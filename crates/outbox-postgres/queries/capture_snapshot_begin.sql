-- `outbox capture snapshot` start of a new snapshot of capture $1 (table $2, key column $3):
-- no row yet, or the last one finished (a new snapshot starts over), or it followed another
-- table or key (the entry changed).
INSERT INTO {{qname:_capture_snapshots}} (name, table_name, key_column)
VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE
SET table_name = EXCLUDED.table_name, key_column = EXCLUDED.key_column, last_key = NULL,
    rows = 0, started_at = now(), finished_at = NULL
