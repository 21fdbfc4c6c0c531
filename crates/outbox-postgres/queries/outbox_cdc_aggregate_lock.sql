-- CDC: serializes parking events behind a dead letter (outbox_cdc_park.sql) with `outbox dead
-- retry` (outbox_cdc_dead_restream.sql) per aggregate, so that each sees what the other
-- committed. Locks in one order (no deadlock between two lockers of several aggregates).
-- $1 aggregate types, $2 aggregate ids (parallel arrays).
SELECT pg_advisory_xact_lock(hashtextextended(
           '{{table}}' || chr(31) || 'dead' || chr(31) || a.t || chr(31) || a.i, 0))
FROM (SELECT DISTINCT t, i FROM unnest($1::text[], $2::text[]) AS u (t, i) ORDER BY t, i) AS a
