-- CDC: keeps table-less events (pg_logical_emit_message) as dead letters, so they can be
-- listed, retried and purged like rows. The insert is published too: the CDC source skips
-- rows whose state is not 'pending'. ON CONFLICT: an event dead-lettered again after a
-- restart stays one row. The insert trigger assigns seq in array order.
-- $1 ids, $2 aggregate types, $3 aggregate ids, $4 event types, $5 payloads, $6 headers,
-- $7 created_at, $8 attempts, $9 reasons (parallel arrays), $10 now.
INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at,
                       state, attempts, last_error, dead_lettered_at)
SELECT r.id, r.aggregate_type, r.aggregate_id, r.event_type, r.payload, r.headers, r.created_at,
       'dead', r.attempts, r.reason, $10
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::jsonb[],
            $7::timestamptz[], $8::int[], $9::text[])
     AS r (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, attempts, reason)
ON CONFLICT (id) DO NOTHING
