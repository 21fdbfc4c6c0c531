-- Copies events into a subscription's table (`[[subscription]]` fan-out) in one statement,
-- keeping each event's id, payload, headers and creation time. Array order becomes seq order
-- (the ordering trigger draws seq per row, in insert order). An id already present is left
-- alone, so copying a batch again after a crash adds nothing. Parallel arrays:
-- $1 ids, $2 aggregate types, $3 aggregate ids, $4 event types, $5 payloads, $6 headers,
-- $7 creation times.
INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at)
SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::jsonb[], $7::timestamptz[])
     WITH ORDINALITY AS e (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, n)
ORDER BY n
ON CONFLICT DO NOTHING
