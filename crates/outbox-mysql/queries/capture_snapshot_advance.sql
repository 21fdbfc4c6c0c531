-- `outbox capture snapshot`, last statement of a chunk's transaction: capture ?'s snapshot
-- (bound last) moves to key ? (NULL: an empty chunk keeps the old one) with ? more rows, and
-- is finished when ? (the chunk was not full: no row after it).
UPDATE {{name:_capture_snapshots}}
SET last_key = COALESCE(?, last_key),
    `rows` = `rows` + ?,
    finished_at = CASE WHEN ? THEN CURRENT_TIMESTAMP(6) END
WHERE name = ?
