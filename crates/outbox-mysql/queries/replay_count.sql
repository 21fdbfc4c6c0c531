-- How many delivered events a replay selects. ? = since, ? ? = until or NULL,
-- ? ? = aggregate_id or NULL, ? ? = event_type or NULL.
SELECT COUNT(*)
FROM {{table}}
WHERE state = 'delivered'
  AND created_at >= ?
  AND (? IS NULL OR created_at < ?)
  AND (? IS NULL OR aggregate_id = ?)
  AND (? IS NULL OR event_type = ?)
