-- `outbox replay`: how many events the selection holds and the first few (shown before
-- replaying, and all that --dry-run does). Polling mode selects delivered rows; CDC mode,
-- which records no delivery per row, selects every row that is not a dead letter.
-- $1 since (created_at >=), $2 until (created_at <, NULL: no bound), $3 aggregate_id or
-- NULL, $4 event_type or NULL, $5 = true in CDC mode, $6 = preview rows.
-- One scan of the table (no index serves created_at over delivered rows; replay is a rare,
-- operator-run command).
WITH selected AS (
    SELECT seq, id, aggregate_type, aggregate_id, event_type, created_at, delivered_at
    FROM {{table}}
    WHERE CASE WHEN $5 THEN state = 'pending' ELSE state = 'delivered' END
      AND created_at >= $1
      AND ($2::timestamptz IS NULL OR created_at < $2)
      AND ($3::text IS NULL OR aggregate_id = $3)
      AND ($4::text IS NULL OR event_type = $4)
)
SELECT (SELECT count(*) FROM selected)                  AS total,
       p.id, p.aggregate_type, p.aggregate_id, p.event_type, p.created_at, p.delivered_at
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (SELECT * FROM selected ORDER BY seq LIMIT $6) AS p ON true
