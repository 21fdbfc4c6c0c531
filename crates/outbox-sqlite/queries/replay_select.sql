-- Delivered events a replay selects, in commit order (`seq`). ?1 = since, ?2 = until or NULL
-- (Unix microseconds), ?3 = aggregate_id or NULL, ?4 = event_type or NULL, ?5 = max rows.
-- `created_at` has no index of its own: a replay is a rare operator command that reads the
-- delivered rows in `seq` order. Prefer narrow windows on large files.
SELECT id, aggregate_type, aggregate_id, event_type, created_at, delivered_at
FROM {{table}}
WHERE state = 'delivered'
  AND created_at >= ?1
  AND (?2 IS NULL OR created_at < ?2)
  AND (?3 IS NULL OR aggregate_id = ?3)
  AND (?4 IS NULL OR event_type = ?4)
ORDER BY seq
LIMIT ?5
