-- `outbox backfill`: locks the pending rows of the held aggregates in subscription table
-- {{table}} (index *_aggregate_idx), whole, in seq (delivery) order, for re-insertion behind
-- the backfilled events, in the claim's column layout, then next_attempt_at (NULL when
-- ready at once), last_error, and whether a lease-token claim holds the row. SKIP LOCKED: a
-- row a relay's claim holds (in flight) is not returned; the caller compares with
-- backfill_pending_count.sql and leaves that aggregate for later. A row locked here cannot
-- be claimed by the subscription's pipeline (its claim skips locked rows).
-- ? = JSON array of [aggregate_type, aggregate_id].
SELECT s.position, s.id, s.aggregate_type, s.aggregate_id, s.event_type, s.payload,
       s.headers, s.created_at, s.attempts, s.seq,
       NULLIF(s.next_attempt_at, '1970-01-01 00:00:01') AS next_attempt_at, s.last_error,
       COALESCE(s.claimed_until >= NOW(6), FALSE) AS leased
FROM JSON_TABLE(?, '$[*]' COLUMNS (
        t VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
        i VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[1]')) AS w
STRAIGHT_JOIN {{table}} AS s FORCE INDEX ({{name:_aggregate_idx}})
    ON s.aggregate_type = w.t AND s.aggregate_id = w.i AND s.state = 'pending'
ORDER BY s.aggregate_type, s.aggregate_id, s.seq
FOR UPDATE SKIP LOCKED
