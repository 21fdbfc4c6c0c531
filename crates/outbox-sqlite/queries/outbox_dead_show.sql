-- One event with everything the table knows about it. ?1 = id (unique key).
-- CAST(payload AS BLOB): a plain-SQL producer may have inserted the payload as text.
SELECT id, aggregate_type, aggregate_id, event_type, CAST(payload AS BLOB), headers,
       created_at, state, attempts, last_error, delivered_at, dead_lettered_at, seq,
       next_attempt_at
FROM {{table}}
WHERE id = ?1
