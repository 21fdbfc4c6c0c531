-- The first earlier event of an aggregate that is not delivered (`outbox why`).
-- ? ? = aggregate, ? = the event's seq, ? = now.
SELECT id, state, attempts, last_error,
       CASE WHEN next_attempt_at > ? THEN next_attempt_at END AS backoff_until, created_at
FROM {{table}}
WHERE aggregate_type = ? AND aggregate_id = ?
  AND state IN ('pending', 'dead')
  AND seq < ?
ORDER BY seq
LIMIT 1
