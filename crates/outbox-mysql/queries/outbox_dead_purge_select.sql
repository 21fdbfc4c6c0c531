-- The dead letters a purge deletes, locked until it commits. ? = dead-lettered before,
-- ? ? = event type or NULL.
SELECT position, id
FROM {{table}}
WHERE state = 'dead'
  AND dead_lettered_at < ?
  AND (? IS NULL OR event_type = ?)
ORDER BY position
FOR UPDATE
