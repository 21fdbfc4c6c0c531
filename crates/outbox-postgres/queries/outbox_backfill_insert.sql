-- `outbox backfill`: inserts the backfilled events and the re-inserted pending rows of the
-- held aggregates into subscription table {{table}}, in array order, which is outbox commit
-- order per aggregate: the insert trigger draws seq per row in insert order (as for
-- outbox_copy_in.sql), so the pipeline delivers and numbers them in that order. Re-inserted
-- rows keep their id, attempts, backoff and last error. Parallel arrays: $1 ids, $2
-- aggregate types, $3 aggregate ids, $4 event types, $5 payloads, $6 headers, $7 creation
-- times, $8 attempts, $9 next attempt times (NULL: ready at once), $10 last errors.
INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at,
                       attempts, next_attempt_at, last_error)
SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at,
       attempts, COALESCE(next_attempt_at, '-infinity'), last_error
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::jsonb[],
            $7::timestamptz[], $8::integer[], $9::timestamptz[], $10::text[])
     WITH ORDINALITY AS e (id, aggregate_type, aggregate_id, event_type, payload, headers,
                           created_at, attempts, next_attempt_at, last_error, n)
ORDER BY n
