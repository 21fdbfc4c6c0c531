-- `outbox capture snapshot`, last statement of a chunk's transaction: capture $1's snapshot
-- moves to key $2 (jsonb text; NULL: an empty chunk keeps the old one) with $3 more rows,
-- and is finished when $4 (the chunk was not full: no row after it).
UPDATE {{qname:_capture_snapshots}}
SET last_key = COALESCE($2::text::jsonb, last_key),
    rows = rows + $3,
    finished_at = CASE WHEN $4 THEN now() END
WHERE name = $1
