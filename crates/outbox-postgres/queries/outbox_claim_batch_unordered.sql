-- Claims the next batch when relay.ordering = "none". $1 = now, $2 = limit.
-- Pending, ready events in seq order (index *_pending_seq_idx); SKIP LOCKED lets replicas
-- claim disjoint batches. Locks last until the claim transaction ends (after the outcome
-- statements), or until the relay's connection dies.
SELECT o.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers,
       o.created_at, o.attempts, NULL::bigint AS gap_seq
FROM {{table}} AS o
WHERE o.state = 'pending'
  AND o.next_attempt_at <= $1
ORDER BY o.seq
LIMIT $2
FOR UPDATE SKIP LOCKED
