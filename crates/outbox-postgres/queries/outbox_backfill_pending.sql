-- `outbox backfill`: locks the pending rows of the held aggregates in subscription table
-- {{table}} (index *_pending_aggregate_idx), whole, for re-insertion behind the backfilled
-- events, with the outbox seq of each event (NULL when retention removed the outbox row).
-- SKIP LOCKED: a row a relay has claimed (in flight) is not returned; the caller compares
-- with outbox_backfill_pending_count.sql and leaves that aggregate for later. A row locked
-- here cannot be claimed by the subscription's pipeline (its claim skips locked rows).
-- next_attempt_at is NULL for '-infinity' (ready at once). $1 aggregate types, $2 aggregate ids.
SELECT s.id, s.aggregate_type, s.aggregate_id, s.event_type, s.payload, s.headers,
       s.created_at, s.attempts, NULLIF(s.next_attempt_at, '-infinity') AS next_attempt_at,
       s.last_error, o.seq AS outbox_seq
FROM {{table}} AS s
LEFT JOIN {{schema}}.{{outbox}} AS o ON o.id = s.id
WHERE s.state = 'pending'
  AND (s.aggregate_type, s.aggregate_id) IN (
      SELECT * FROM unnest($1::text[], $2::text[]))
ORDER BY s.seq
FOR UPDATE OF s SKIP LOCKED
