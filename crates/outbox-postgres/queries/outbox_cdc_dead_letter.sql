-- CDC: dead-letters streamed outbox rows by id (primary key). The publication publishes
-- inserts only, so this UPDATE is no stream event. `state = 'pending'` keeps it idempotent.
-- $1 ids, $2 attempts, $3 reasons (parallel arrays), $4 now.
UPDATE {{table}} AS o
SET state = 'dead',
    attempts = r.attempts,
    last_error = r.reason,
    dead_lettered_at = $4
FROM unnest($1::uuid[], $2::int[], $3::text[]) AS r (id, attempts, reason)
WHERE o.id = r.id AND o.state = 'pending'
