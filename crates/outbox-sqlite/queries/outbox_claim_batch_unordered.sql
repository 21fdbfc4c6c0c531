-- Reads the next batch when relay.ordering = "none". ?1 = now (Unix microseconds),
-- ?2 = limit. Pending, ready events in seq order (index *_pending_seq_idx); a failed event
-- holds nothing back. Like the ordered claim, only the relay lease holder runs it.
SELECT o.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type,
       CAST(o.payload AS BLOB) AS payload, o.headers, o.created_at, o.attempts
FROM {{table}} AS o
WHERE o.state = 'pending'
  AND o.next_attempt_at <= ?1
ORDER BY o.seq
LIMIT ?2
