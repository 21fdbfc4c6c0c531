-- `outbox capture snapshot`, last statement of a chunk's transaction: capture ?4's snapshot
-- moves to key ?1 (NULL: an empty chunk keeps the old one) with ?2 more rows, and is
-- finished (at ?5 Unix microseconds) when ?3 (the chunk was not full: no row after it).
UPDATE {{name:_capture_snapshots}}
SET last_key = COALESCE(?1, last_key),
    "rows" = "rows" + ?2,
    finished_at = CASE WHEN ?3 THEN ?5 END
WHERE name = ?4
