-- `outbox backfill`: one page of retained events of outbox table {{table}} by id, in seq
-- (commit) order, with their seq. ?1 = JSON array of ids (outbox_backfill_ids.sql). A row
-- removed meanwhile by retention is simply not returned.
SELECT seq, id, aggregate_type, aggregate_id, event_type, CAST(payload AS BLOB) AS payload,
       headers, created_at
FROM {{table}}
WHERE id IN (SELECT value FROM json_each(?1))
ORDER BY seq
