-- Deletes dead letters dead-lettered before ?1 (Unix microseconds), optionally only of
-- event type ?2.
DELETE FROM {{table}}
WHERE state = 'dead'
  AND dead_lettered_at < ?1
  AND (?2 IS NULL OR event_type = ?2)
RETURNING id
