-- `outbox why`: pending events not in backoff ahead of this one in claim order (seq). Counts a
-- range of *_pending_seq_idx; bounded by $3 so a huge backlog costs little. $1 = seq,
-- $2 = now, $3 = cap.
SELECT count(*) FROM (
    SELECT 1 FROM {{table}}
    WHERE state = 'pending' AND seq < $1 AND next_attempt_at <= $2
    LIMIT $3
) AS ahead
