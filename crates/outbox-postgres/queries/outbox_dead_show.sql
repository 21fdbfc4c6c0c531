-- One event with everything the table knows about it. $1 = id (primary key).
-- Also what `outbox why` needs: the per-attempt history (attempt_errors) and the backoff
-- time (NULL unless in the future: -infinity, "ready at once", has no OffsetDateTime).
-- $2 = now.
SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, state,
       attempts, last_error, delivered_at, dead_lettered_at, seq, attempt_errors,
       CASE WHEN next_attempt_at > $2 THEN next_attempt_at END AS backoff_until
FROM {{table}}
WHERE id = $1
