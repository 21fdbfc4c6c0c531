-- Records one failed attempt per event and when to try again. $1 = seqs, $2 = next attempt
-- times, $3 = errors (parallel arrays, one statement for the whole batch).
-- Also appends the attempt to `attempt_errors` (the last 10 are kept: when the array is
-- full its oldest entry, index 0, is dropped first). `at` is the server's clock at the
-- statement: the relay passes no `now` to this statement.
UPDATE {{table}} AS o
SET attempts = o.attempts + 1,
    next_attempt_at = r.next_attempt_at,
    last_error = r.error,
    attempt_errors = CASE WHEN jsonb_array_length(o.attempt_errors) >= 10
                          THEN o.attempt_errors - 0
                          ELSE o.attempt_errors END
                     || jsonb_build_array(jsonb_build_object(
                            'attempt', o.attempts + 1,
                            'at', clock_timestamp(),
                            'error', r.error,
                            'kind', 'retry'))
FROM unnest($1::bigint[], $2::timestamptz[], $3::text[]) AS r (seq, next_attempt_at, error)
WHERE o.seq = r.seq AND o.state = 'pending'
