-- Claims the next batch when relay.ordering = none. ? = now, ? = limit.
-- Pending, ready events in insert order (index *_pending_idx); SKIP LOCKED lets replicas
-- claim disjoint batches. Locks last until the claim transaction ends.
SELECT o.position, o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload,
       o.headers, o.created_at, o.attempts, o.seq
FROM {{table}} AS o FORCE INDEX ({{name:_pending_idx}})
WHERE o.state = 'pending'
  AND o.next_attempt_at <= ?
ORDER BY o.position
LIMIT ?
FOR UPDATE SKIP LOCKED
