-- Puts dead letters back in line: pending, attempts reset, ready at once. `seq` is kept, so
-- a retried event is still ahead of the later events of its aggregate (which waited behind
-- it under dead_letter = "hold-aggregate") and is delivered first.
-- ?1 = JSON array of ids or NULL, ?2 = event_type or NULL, ?3 = 1 for every dead letter.
UPDATE {{table}}
SET state = 'pending', attempts = 0, next_attempt_at = 0, dead_lettered_at = NULL
WHERE state = 'dead'
  AND (?3 OR id IN (SELECT value FROM json_each(coalesce(?1, '[]'))) OR event_type = ?2)
RETURNING id
