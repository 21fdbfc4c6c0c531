-- `outbox why`: the first earlier undelivered event of the same aggregate, which the claim
-- waits for (per-aggregate order): a dead letter (dead_letter = "hold-aggregate"), a retrying
-- event in backoff, or a ready one that must go first. $1 aggregate_type, $2 aggregate_id,
-- $3 seq of the event asked about, $4 now. Reads *_pending_aggregate_idx and *_held_idx.
SELECT e.id, e.state, e.attempts, e.last_error,
       CASE WHEN e.next_attempt_at > $4 THEN e.next_attempt_at END AS backoff_until,
       e.created_at
FROM {{table}} AS e
WHERE e.aggregate_type = $1 AND e.aggregate_id = $2 AND e.seq < $3
  AND (e.state = 'dead' OR e.state = 'pending')
ORDER BY e.seq
LIMIT 1
