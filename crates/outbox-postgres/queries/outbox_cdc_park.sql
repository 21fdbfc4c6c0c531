-- CDC: parks events behind a dead letter of their aggregate (dead_letter = "hold-aggregate",
-- `last_error` = "held: ..."), but only those that a dead letter with a lower seq still holds
-- when the statement runs. It runs after the aggregates' locks
-- (outbox_cdc_aggregate_lock.sql): a `dead retry` that committed first wins, the event is not
-- parked, and the relay streams it again after the retried one. The UPDATE is no stream event.
-- $1 ids, $2 attempts, $3 reasons (parallel arrays), $4 now. Returns the ids parked.
UPDATE {{table}} AS o
SET state = 'dead',
    attempts = r.attempts,
    last_error = r.reason,
    dead_lettered_at = $4
FROM unnest($1::uuid[], $2::int[], $3::text[]) AS r (id, attempts, reason)
WHERE o.id = r.id
  AND o.state = 'pending'
  AND EXISTS (SELECT 1 FROM {{table}} AS d
              WHERE d.aggregate_type = o.aggregate_type
                AND d.aggregate_id = o.aggregate_id
                AND d.state = 'dead'
                AND d.seq < o.seq)
RETURNING o.id
