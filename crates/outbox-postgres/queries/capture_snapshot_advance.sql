-- `outbox capture snapshot`, last statement of a chunk's transaction: capture $4's snapshot
-- moves to key $1 (jsonb text; NULL: an empty chunk keeps the old one) with $2 more rows,
-- and is finished when $3 (the chunk was not full: no row after it).
UPDATE {{qname:_capture_snapshots}}
SET last_key = COALESCE($1::text::jsonb, last_key),
    rows = rows + $2,
    finished_at = CASE WHEN $3 THEN now() END
WHERE name = $4
