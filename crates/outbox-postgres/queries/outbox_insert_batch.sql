-- Writes many events in one round trip, in the caller's transaction, in array order (which
-- becomes seq order, so a batch keeps its per-aggregate order). Parallel arrays:
-- $1 ids, $2 aggregate types, $3 aggregate ids, $4 event types, $5 payloads, $6 headers.
INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers)
SELECT id, aggregate_type, aggregate_id, event_type, payload, headers
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::jsonb[])
     WITH ORDINALITY AS e (id, aggregate_type, aggregate_id, event_type, payload, headers, n)
ORDER BY n
