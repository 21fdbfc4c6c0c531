-- Puts dead letters back in line: pending, attempts reset, ready at once. `seq` is kept, so
-- a retried event is still ahead of the later events of its aggregate (which waited behind
-- it under dead_letter = "hold-aggregate") and is delivered first. The attempt history
-- (`attempt_errors`, last 10 kept) records the requeue, so `outbox why` tells it.
-- $1 = ids or NULL, $2 = event_type or NULL, $3 = all dead letters.
UPDATE {{table}}
SET state = 'pending', attempts = 0, next_attempt_at = '-infinity', dead_lettered_at = NULL,
    attempt_errors = CASE WHEN jsonb_array_length(attempt_errors) >= 10
                          THEN attempt_errors - 0
                          ELSE attempt_errors END
                     || jsonb_build_array(jsonb_build_object(
                            'attempt', attempts,
                            'at', clock_timestamp(),
                            'error', 'put back in line by `outbox dead retry`',
                            'kind', 'requeued'))
WHERE state = 'dead'
  AND ($3 OR id = ANY($1) OR event_type = $2)
RETURNING id
