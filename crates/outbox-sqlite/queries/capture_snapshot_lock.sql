-- `outbox capture snapshot`, first statement of a chunk's BEGIN IMMEDIATE transaction (which
-- holds SQLite's write lock: a concurrent run of the same snapshot waits for it and then
-- reads the key this chunk recorded). The unfinished snapshot of capture ?1: the storage
-- class and value of its last key. No row: the snapshot finished (in another run).
SELECT typeof(last_key), last_key
FROM {{name:_capture_snapshots}}
WHERE name = ?1 AND finished_at IS NULL
