-- `outbox why`: the first earlier undelivered event of the same aggregate, which the relay
-- waits for (per-aggregate order). ?1 aggregate_type, ?2 aggregate_id, ?3 seq of the event
-- asked about, ?4 now (Unix microseconds). Rows by rowid order within the aggregate.
SELECT id, state, attempts, last_error,
       CASE WHEN next_attempt_at > ?4 THEN next_attempt_at END AS backoff_until,
       created_at
FROM {{table}}
WHERE aggregate_type = ?1 AND aggregate_id = ?2 AND seq < ?3
  AND state IN ('pending', 'dead')
ORDER BY seq
LIMIT 1
