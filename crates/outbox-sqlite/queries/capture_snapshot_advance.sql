-- `outbox capture snapshot`, last statement of a chunk's transaction: capture ?1's snapshot
-- moves to key ?2 (NULL: an empty chunk keeps the old one) with ?3 more rows, and is
-- finished (at ?5 Unix microseconds) when ?4 (the chunk was not full: no row after it).
UPDATE {{name:_capture_snapshots}}
SET last_key = COALESCE(?2, last_key),
    "rows" = "rows" + ?3,
    finished_at = CASE WHEN ?4 THEN ?5 END
WHERE name = ?1
