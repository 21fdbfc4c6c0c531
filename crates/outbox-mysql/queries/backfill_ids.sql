-- `outbox backfill`: the ids of the retained (delivered, so fanned out) events of outbox
-- table {{table}}, grouped by aggregate and in seq (commit) order within each (index
-- *_aggregate_idx), so that a page holds whole aggregates (see the PostgreSQL
-- outbox_backfill_ids.sql). ? ? = since (created_at >=, UTC; NULL: all).
SELECT id
FROM {{table}}
WHERE state = 'delivered'
  AND (? IS NULL OR created_at >= ?)
ORDER BY aggregate_type, aggregate_id, seq
