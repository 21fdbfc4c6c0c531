-- Claims the next batch for per-aggregate ordering: pending, ready events in insert order
-- (index *_pending_idx), skipping any whose aggregate has an earlier event that is waiting
-- for its next attempt, or dead while dead letters hold their aggregate (index
-- *_aggregate_idx: only that aggregate's pending or dead entries are read).
-- ? = now, ? = now, ? = 1 when a dead letter holds its aggregate, ? = limit.
--
-- Runs in the relay's claim transaction (READ COMMITTED), which stays open while the batch is
-- published and ends with the outcome statements: the row locks taken here keep other
-- replicas off these events (SKIP LOCKED), and vanish with the connection if the relay dies.
-- The subqueries are plain reads: they lock nothing.
--
-- Not every claimed event may go out: an earlier event of its aggregate may be locked by
-- another replica. `outbox_claim_gaps.sql` finds those aggregates; see src/poll.rs.
SELECT o.position, o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload,
       o.headers, o.created_at, o.attempts, o.seq
FROM {{table}} AS o
WHERE o.state = 'pending'
  AND o.next_attempt_at <= ?
  AND NOT EXISTS (
      SELECT 1
      FROM {{table}} AS e
      WHERE e.aggregate_type = o.aggregate_type
        AND e.aggregate_id = o.aggregate_id
        AND e.state = 'pending'
        AND e.seq < o.seq
        AND e.next_attempt_at > ?
  )
  AND NOT (? AND EXISTS (
      SELECT 1
      FROM {{table}} AS e
      WHERE e.aggregate_type = o.aggregate_type
        AND e.aggregate_id = o.aggregate_id
        AND e.state = 'dead'
        AND e.seq < o.seq
  ))
ORDER BY o.position
LIMIT ?
FOR UPDATE SKIP LOCKED
