-- `outbox backfill`: one page of retained outbox events by primary key, in seq (commit)
-- order, with their seq. $1 = ids from outbox_backfill_ids.sql. A row removed meanwhile by
-- retention is simply not returned.
SELECT seq, id, aggregate_type, aggregate_id, event_type, payload, headers, created_at
FROM {{table}}
WHERE id = ANY($1)
ORDER BY seq
