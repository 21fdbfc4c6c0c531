-- One event with everything the table knows about it. ? = id (unique key).
SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, state,
       attempts, last_error, delivered_at, dead_lettered_at, seq, next_attempt_at
FROM {{table}}
WHERE id = ?
