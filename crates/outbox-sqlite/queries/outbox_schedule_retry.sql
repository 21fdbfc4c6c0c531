-- Records one failed attempt per event and when to try again. ?1 = JSON array of
-- [seq, next_attempt_at (Unix microseconds), error] triples: one statement for the whole
-- batch, rows found by primary key.
UPDATE {{table}} AS o
SET attempts = o.attempts + 1,
    next_attempt_at = r.next_attempt_at,
    last_error = r.error
FROM (SELECT j.value ->> 0 AS seq, j.value ->> 1 AS next_attempt_at, j.value ->> 2 AS error
      FROM json_each(?1) AS j) AS r
WHERE o.seq = r.seq AND o.state = 'pending'
