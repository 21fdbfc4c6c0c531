-- Dead-letters events: kept, queryable, retryable (`outbox dead retry`). ?1 = JSON array of
-- [seq, reason] pairs, ?2 = now (Unix microseconds). Rows found by primary key.
UPDATE {{table}} AS o
SET state = 'dead',
    attempts = o.attempts + 1,
    last_error = r.reason,
    dead_lettered_at = ?2
FROM (SELECT j.value ->> 0 AS seq, j.value ->> 1 AS reason FROM json_each(?1) AS j) AS r
WHERE o.seq = r.seq AND o.state = 'pending'
