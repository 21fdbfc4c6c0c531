-- How many delivered events a replay selects. ?1 = since, ?2 = until or NULL (Unix
-- microseconds), ?3 = aggregate_id or NULL, ?4 = event_type or NULL.
SELECT count(*)
FROM {{table}}
WHERE state = 'delivered'
  AND created_at >= ?1
  AND (?2 IS NULL OR created_at < ?2)
  AND (?3 IS NULL OR aggregate_id = ?3)
  AND (?4 IS NULL OR event_type = ?4)
