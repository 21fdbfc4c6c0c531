-- `outbox backfill`: the ids of the retained outbox events, in seq (commit) order, read once
-- (16 bytes each in the caller's memory; seq has no index over delivered rows, as for
-- outbox_replay_ids.sql). Polling mode: delivered rows (fanned out). CDC mode, which records
-- no delivery per row: every row that is not a dead letter. $1 since (created_at >=; NULL:
-- all), $2 = true in CDC mode.
SELECT id
FROM {{table}}
WHERE CASE WHEN $2 THEN state = 'pending' ELSE state = 'delivered' END
  AND ($1::timestamptz IS NULL OR created_at >= $1)
ORDER BY seq
