-- `outbox backfill`: the ids of the retained (delivered, so fanned out) events of outbox
-- table {{table}}, grouped by aggregate and in seq (commit) order within each, so that a
-- page holds whole aggregates (see the PostgreSQL outbox_backfill_ids.sql). ?1 = since
-- (created_at >=, Unix microseconds; NULL: all).
SELECT id
FROM {{table}}
WHERE state = 'delivered'
  AND (?1 IS NULL OR created_at >= ?1)
ORDER BY aggregate_type, aggregate_id, seq
