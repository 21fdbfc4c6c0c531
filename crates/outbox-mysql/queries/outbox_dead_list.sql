-- Dead letters, oldest first, optionally filtered. ? ? = event_type or NULL,
-- ? ? = aggregate_id or NULL, ? = max rows. Dead rows through *_pending_idx (state, position).
SELECT id, aggregate_type, aggregate_id, event_type, attempts, last_error, created_at,
       dead_lettered_at
FROM {{table}}
WHERE state = 'dead'
  AND (? IS NULL OR event_type = ?)
  AND (? IS NULL OR aggregate_id = ?)
ORDER BY position
LIMIT ?
