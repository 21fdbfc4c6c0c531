-- Dead letters, oldest first, optionally filtered. ?1 = event_type or NULL,
-- ?2 = aggregate_id or NULL, ?3 = max rows. Dead rows are found through *_held_idx: its
-- predicate is repeated word for word (SQLite uses a partial index only then).
SELECT id, aggregate_type, aggregate_id, event_type, attempts, last_error, created_at,
       dead_lettered_at
FROM {{table}}
WHERE (state = 'dead' OR (state = 'pending' AND attempts > 0)) AND state = 'dead'
  AND (?1 IS NULL OR event_type = ?1)
  AND (?2 IS NULL OR aggregate_id = ?2)
ORDER BY seq
LIMIT ?3
