-- Delivered events a replay selects, oldest first. ? = since, ? ? = until or NULL,
-- ? ? = aggregate_id or NULL, ? ? = event_type or NULL, ? = max rows.
-- `created_at` has no index of its own: a replay is a rare operator command; it reads the
-- delivered rows in position order until the limit. Prefer narrow windows on large tables.
SELECT id, aggregate_type, aggregate_id, event_type, created_at, delivered_at
FROM {{table}}
WHERE state = 'delivered'
  AND created_at >= ?
  AND (? IS NULL OR created_at < ?)
  AND (? IS NULL OR aggregate_id = ?)
  AND (? IS NULL OR event_type = ?)
ORDER BY position
LIMIT ?
