-- Aggregates held by a retrying or dead event (`outbox status`): the head event of each and
-- how many later events wait behind it. ? = max rows.
SELECT h.aggregate_type, h.aggregate_id, h.id, h.state, h.attempts, h.next_attempt_at,
       h.last_error,
       (SELECT COUNT(*) FROM {{table}} AS w
         WHERE w.aggregate_type = h.aggregate_type AND w.aggregate_id = h.aggregate_id
           AND w.state = 'pending' AND w.seq > h.seq) AS waiting
FROM {{table}} AS h
WHERE (h.state = 'dead' OR (h.state = 'pending' AND h.attempts > 0))
  AND NOT EXISTS (
      SELECT 1 FROM {{table}} AS e
      WHERE e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id
        AND e.state IN ('pending', 'dead') AND e.seq < h.seq)
ORDER BY h.position
LIMIT ?
