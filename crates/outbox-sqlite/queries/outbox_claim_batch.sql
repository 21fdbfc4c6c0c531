-- Reads the next batch for per-aggregate (or total) ordering. ?1 = now (Unix microseconds),
-- ?2 = limit, ?3 = 1 when a dead letter holds its aggregate (relay.dead_letter =
-- "hold-aggregate"), else 0.
--
-- No row locks: SQLite has none, and needs none here, because only the holder of the relay
-- lease runs this query (see outbox_lease_acquire.sql), so no other relay can claim these
-- events until this one settles them or its lease expires.
--
-- Pending, ready events in seq order (index *_pending_seq_idx), skipping any whose aggregate
-- is held by an earlier retrying (backoff not over) or dead event (index *_held_idx; its
-- predicate is repeated word for word so the planner can use it). seq order is commit order
-- (see the migration), and every earlier pending event of an aggregate is either held (then
-- so is this one) or ready and earlier in this same seq-ordered batch: so an event is returned
-- only when every earlier event of its aggregate is delivered or in the batch. No gap check
-- is needed, unlike PostgreSQL, where concurrent replicas hold rows this query cannot see.
--
-- `last_position`: the aggregate's delivery-position head (outbox_core::aggregate_seq).
--
-- CAST(payload AS BLOB): a plain-SQL producer may have inserted the payload as text.
SELECT o.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type,
       CAST(o.payload AS BLOB) AS payload, o.headers, o.created_at, o.attempts,
       coalesce((SELECT p.last_position FROM {{name:_aggregate_positions}} AS p
                 WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id),
                0) AS last_position
FROM {{table}} AS o
WHERE o.state = 'pending'
  AND o.next_attempt_at <= ?1
  AND NOT EXISTS (
      SELECT 1
      FROM {{table}} AS e
      WHERE e.aggregate_type = o.aggregate_type
        AND e.aggregate_id = o.aggregate_id
        AND e.seq < o.seq
        AND (e.state = 'dead' OR (e.state = 'pending' AND e.attempts > 0))
        AND CASE WHEN e.state = 'dead' THEN ?3 ELSE e.next_attempt_at > ?1 END
  )
ORDER BY o.seq
LIMIT ?2
