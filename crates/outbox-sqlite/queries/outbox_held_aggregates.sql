-- `outbox status`: aggregates whose first undelivered event is retrying or dead, with how
-- many pending events wait behind it. ?1 limit. The head is the aggregate's lowest-seq row
-- that is pending or dead; the partial index on (aggregate_type, aggregate_id, seq) of
-- undelivered rows answers both lookups.
SELECT h.aggregate_type, h.aggregate_id, h.id, h.state, h.attempts,
       CASE WHEN h.state = 'pending' THEN h.next_attempt_at END AS next_attempt_at,
       h.last_error,
       (SELECT count(*) FROM {{table}} p
         WHERE p.aggregate_type = h.aggregate_type AND p.aggregate_id = h.aggregate_id
           AND p.state = 'pending' AND p.seq > h.seq) AS waiting
FROM {{table}} h
WHERE (h.state = 'dead' OR (h.state = 'pending' AND h.attempts > 0))
  AND NOT EXISTS (
    SELECT 1 FROM {{table}} e
    WHERE e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id
      AND e.seq < h.seq AND e.state IN ('pending', 'dead'))
ORDER BY h.seq
LIMIT ?1
