-- Claims the next batch for per-aggregate ordering: pending, ready events in insert order
-- (index *_pending_idx), skipping any whose aggregate's first pending event is an earlier one
-- waiting for its next attempt (only an aggregate's first pending event is ever attempted),
-- or whose first dead event is earlier while dead letters hold their aggregate. Each probe
-- reads one entry of *_aggregate_idx, index only: an EXISTS over the aggregate's earlier
-- events would read all its pending entries (MySQL uses no range for it). The index is
-- forced: with statistics taken while few rows were pending, the optimizer picked
-- *_pending_idx for the probes, which then scanned every pending row per claimed row, and
-- under a steady load the claim slowed down as the backlog it caused grew (seconds per claim,
-- measured with `outbox bench steady`).
-- ? = now, ? = now, ? = 1 when a dead letter holds its aggregate, ? = limit.
--
-- Runs in the relay's claim transaction (READ COMMITTED), which stays open while the batch is
-- published and ends with the outcome statements: the row locks taken here keep other
-- replicas off these events (SKIP LOCKED), and vanish with the connection if the relay dies.
-- The subqueries are plain reads: they lock nothing.
--
-- Not every claimed event may go out: an earlier event of its aggregate may be locked by
-- another replica. `first_pending` and `first_dead` (read in this statement's snapshot, taken
-- when it began) tell: an aggregate goes out only from its first pending event. A row newer
-- than the snapshot (the locking read sees the latest committed rows) has no `first_pending`
-- and waits for the next claim. See src/poll.rs.
SELECT o.position, o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload,
       o.headers, o.created_at, o.attempts, o.seq,
       -- The aggregate's first pending and first dead event in this statement's snapshot.
       (SELECT h.seq
        FROM {{table}} AS h FORCE INDEX ({{name:_aggregate_idx}})
        WHERE h.aggregate_type = o.aggregate_type
          AND h.aggregate_id = o.aggregate_id
          AND h.state = 'pending'
        ORDER BY h.seq
        LIMIT 1) AS first_pending,
       (SELECT d.seq
        FROM {{table}} AS d FORCE INDEX ({{name:_aggregate_idx}})
        WHERE d.aggregate_type = o.aggregate_type
          AND d.aggregate_id = o.aggregate_id
          AND d.state = 'dead'
        ORDER BY d.seq
        LIMIT 1) AS first_dead
FROM {{table}} AS o FORCE INDEX ({{name:_pending_idx}})
WHERE o.state = 'pending'
  AND o.next_attempt_at <= ?
  -- The aggregate's first pending event is an earlier one waiting for its next attempt.
  AND NOT COALESCE((
      SELECT h.seq < o.seq AND h.next_attempt_at > ?
      FROM {{table}} AS h FORCE INDEX ({{name:_aggregate_idx}})
      WHERE h.aggregate_type = o.aggregate_type
        AND h.aggregate_id = o.aggregate_id
        AND h.state = 'pending'
      ORDER BY h.seq
      LIMIT 1), FALSE)
  -- The aggregate's first dead event is an earlier one (hold-aggregate).
  AND NOT (? AND COALESCE((
      SELECT d.seq < o.seq
      FROM {{table}} AS d FORCE INDEX ({{name:_aggregate_idx}})
      WHERE d.aggregate_type = o.aggregate_type
        AND d.aggregate_id = o.aggregate_id
        AND d.state = 'dead'
      ORDER BY d.seq
      LIMIT 1), FALSE))
ORDER BY o.position
LIMIT ?
FOR UPDATE SKIP LOCKED
