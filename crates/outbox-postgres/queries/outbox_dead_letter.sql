-- Dead-letters events: kept, queryable, retryable (`outbox dead retry`). $1 = seqs,
-- $2 = reasons (parallel arrays), $3 = now.
UPDATE {{table}} AS o
SET state = 'dead',
    attempts = o.attempts + 1,
    last_error = r.reason,
    dead_lettered_at = $3
FROM unnest($1::bigint[], $2::text[]) AS r (seq, reason)
WHERE o.seq = r.seq AND o.state = 'pending'
