-- Claims the next batch for per-aggregate ordering. $1 = now, $2 = limit,
-- $3 = true when a dead letter holds its aggregate (relay.dead_letter = "hold-aggregate").
--
-- Runs in the relay's claim transaction, which stays open while the batch is published and
-- ends with the outcome statements: the row locks taken here are what keeps other replicas
-- off these events (SKIP LOCKED), and they vanish with the connection if the relay dies, so
-- a killed relay's events are claimable again at once (no lease to expire).
--
-- `claimed`: pending, ready events in seq order (index *_pending_seq_idx), skipping any whose
-- aggregate is held by an earlier retrying or dead event (index *_held_idx; its predicate is
-- repeated below so the planner can use it).
--
-- `gap_seq`: for each claimed aggregate, the first earlier pending event that this batch does
-- NOT hold (locked by another replica, or invisible to the held-check's snapshot). The relay
-- delivers only events before the gap; the rest are released untouched. It is computed only
-- when the batch is not the whole pending prefix (`no_gap`, below). Together with the
-- insert trigger (seq order = commit order per aggregate) this keeps guarantee 3 with any
-- number of replicas. See docs/ordering.md.
--
-- `last_position`: the aggregate's delivery-position head (outbox_core::aggregate_seq), read in
-- the same snapshot as the events, so it counts exactly the events this batch follows.
WITH claimed AS MATERIALIZED (
    SELECT o.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload,
           o.headers, o.created_at, o.attempts
    FROM {{table}} AS o
    WHERE o.state = 'pending'
      AND o.next_attempt_at <= $1
      AND NOT EXISTS (
          SELECT 1
          FROM {{table}} AS e
          WHERE e.aggregate_type = o.aggregate_type
            AND e.aggregate_id = o.aggregate_id
            AND e.seq < o.seq
            AND (e.state = 'dead' OR (e.state = 'pending' AND e.attempts > 0))
            AND CASE WHEN e.state = 'dead' THEN $3 ELSE e.next_attempt_at > $1 END
      )
    ORDER BY o.seq
    LIMIT $2
    FOR UPDATE OF o SKIP LOCKED
),
-- Fast path: when every pending event up to the batch's last seq is in the batch, nothing can
-- sit in a gap (the usual case with one relay, or replicas on different aggregates). Counting
-- that range of *_pending_seq_idx is much cheaper than one probe per claimed aggregate.
no_gap AS MATERIALIZED (
    SELECT (SELECT count(*)
            FROM {{table}} AS e
            WHERE e.state = 'pending' AND e.seq <= (SELECT max(seq) FROM claimed))
         = (SELECT count(*) FROM claimed) AS yes
),
held AS (
    SELECT aggregate_type, aggregate_id, max(seq) AS last_seq
    FROM claimed
    WHERE NOT (SELECT yes FROM no_gap)
    GROUP BY aggregate_type, aggregate_id
),
gaps AS (
    SELECT h.aggregate_type, h.aggregate_id,
           (SELECT min(e.seq)
            FROM {{table}} AS e
            WHERE e.aggregate_type = h.aggregate_type
              AND e.aggregate_id = h.aggregate_id
              AND e.state = 'pending'
              AND e.seq < h.last_seq
              AND e.seq NOT IN (SELECT seq FROM claimed)) AS gap_seq
    FROM held AS h
)
SELECT c.seq, c.id, c.aggregate_type, c.aggregate_id, c.event_type, c.payload, c.headers,
       c.created_at, c.attempts, g.gap_seq, COALESCE(p.last_position, 0) AS last_position
FROM claimed AS c
LEFT JOIN gaps AS g USING (aggregate_type, aggregate_id)
LEFT JOIN {{qname:_aggregate_positions}} AS p USING (aggregate_type, aggregate_id)
ORDER BY c.seq
