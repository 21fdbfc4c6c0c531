-- Dead-letters events: kept, queryable, retryable (`outbox dead retry`). $1 = seqs,
-- $2 = reasons (parallel arrays), $3 = now.
-- The final attempt is appended to `attempt_errors` like every retry (last 10 kept).
UPDATE {{table}} AS o
SET state = 'dead',
    attempts = o.attempts + 1,
    last_error = r.reason,
    dead_lettered_at = $3,
    attempt_errors = CASE WHEN jsonb_array_length(o.attempt_errors) >= 10
                          THEN o.attempt_errors - 0
                          ELSE o.attempt_errors END
                     || jsonb_build_array(jsonb_build_object(
                            'attempt', o.attempts + 1,
                            'at', $3,
                            'error', r.reason,
                            'kind', 'dead'))
FROM unnest($1::bigint[], $2::text[]) AS r (seq, reason)
WHERE o.seq = r.seq AND o.state = 'pending'
