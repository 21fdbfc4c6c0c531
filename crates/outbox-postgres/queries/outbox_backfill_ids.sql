-- `outbox backfill`: the ids of the retained outbox events, grouped by aggregate and in seq
-- (commit) order within each, read once (16 bytes each in the caller's memory; a sort, as
-- seq has no index over delivered rows, as for outbox_replay_ids.sql). Grouped so that a page
-- holds whole aggregates: each aggregate's pending rows in the subscription table are locked
-- and read by one page (or a few for a long aggregate), not again by every page that holds
-- one of its events, which made the work per page grow with what was already copied.
-- Polling mode: delivered rows (fanned out). CDC mode, which records no delivery per row:
-- every row that is not a dead letter. $1 since (created_at >=; NULL: all), $2 = true in CDC
-- mode.
SELECT id
FROM {{table}}
WHERE CASE WHEN $2 THEN state = 'pending' ELSE state = 'delivered' END
  AND ($1::timestamptz IS NULL OR created_at >= $1)
ORDER BY aggregate_type, aggregate_id, seq
