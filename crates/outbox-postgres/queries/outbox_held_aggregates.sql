-- What holds delivery back, for `outbox status` and the watchdog: aggregates whose head
-- event is retrying (backoff) or dead-lettered, with how many events wait behind it.
-- $1 = now, $2 = max rows. Uses *_held_idx and *_pending_aggregate_idx.
SELECT h.aggregate_type, h.aggregate_id, h.id AS head_id, h.state, h.attempts,
       -- NULL unless in the future (-infinity, "ready at once", has no OffsetDateTime).
       CASE WHEN h.state = 'pending' AND h.next_attempt_at > $1 THEN h.next_attempt_at END,
       h.last_error,
       (SELECT count(*) FROM {{table}} AS p
         WHERE p.aggregate_type = h.aggregate_type AND p.aggregate_id = h.aggregate_id
           AND p.state = 'pending' AND p.seq > h.seq) AS waiting
FROM {{table}} AS h
WHERE (h.state = 'dead' OR (h.state = 'pending' AND h.attempts > 0))
  AND NOT EXISTS (
      SELECT 1 FROM {{table}} AS e
      WHERE e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id
        AND e.seq < h.seq
        AND (e.state = 'dead' OR (e.state = 'pending' AND e.attempts > 0)))
ORDER BY h.seq
LIMIT $2
