-- CDC mode: puts dead letters back in line by deleting and re-inserting them, because the
-- publication streams inserts only (an UPDATE back to 'pending' would never be seen).
-- Every dead row of each chosen aggregate is re-inserted, in seq order, so the events that
-- were parked behind a dead letter ("held: ...") follow it in order. Same ids: consumers
-- still dedupe. Run in a transaction that set `outbox.keep_seq` (migration 0005): each row
-- keeps its seq, and is marked as put back (pending, attempts 0, `last_error` kept) until
-- the relay has delivered it, so that a relay streaming the slot's unconfirmed tail again
-- does not let a later event of the aggregate overtake it. The attempt history records the
-- requeue, as in polling mode.
-- $1 = ids or NULL, $2 = event_type or NULL, $3 = all dead letters.
WITH chosen AS (
    SELECT DISTINCT aggregate_type, aggregate_id
    FROM {{table}}
    WHERE state = 'dead' AND ($3 OR id = ANY($1) OR event_type = $2)
),
gone AS (
    DELETE FROM {{table}} AS o
    USING chosen AS c
    WHERE o.state = 'dead'
      AND o.aggregate_type = c.aggregate_type
      AND o.aggregate_id = c.aggregate_id
    RETURNING o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers,
              o.created_at, o.seq, o.attempts, o.last_error, o.attempt_errors
)
INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at,
                       seq, last_error, attempt_errors)
SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, seq,
       coalesce(last_error, 'dead letter'),
       CASE WHEN jsonb_array_length(attempt_errors) >= 10
            THEN attempt_errors - 0
            ELSE attempt_errors END
       || jsonb_build_array(jsonb_build_object(
              'attempt', attempts,
              'at', clock_timestamp(),
              'error', 'put back in line by `outbox dead retry`',
              'kind', 'requeued'))
FROM gone
ORDER BY seq
RETURNING id
