-- Records one failed attempt per event and when to try again. $1 = seqs, $2 = next attempt
-- times, $3 = errors (parallel arrays, one statement for the whole batch).
UPDATE {{table}} AS o
SET attempts = o.attempts + 1,
    next_attempt_at = r.next_attempt_at,
    last_error = r.error
FROM unnest($1::bigint[], $2::timestamptz[], $3::text[]) AS r (seq, next_attempt_at, error)
WHERE o.seq = r.seq AND o.state = 'pending'
