-- Dead-letters streamed events: the row is kept, queryable and retryable (`outbox dead
-- retry` puts it back to `pending`, and the stream publishes that change).
-- ? = JSON array of [row position, attempts, reason], ? = now.
UPDATE JSON_TABLE(?, '$[*]' COLUMNS (
        p BIGINT PATH '$[0]',
        n INT PATH '$[1]',
        reason TEXT CHARACTER SET utf8mb4 PATH '$[2]')) AS r
STRAIGHT_JOIN {{table}} AS o FORCE INDEX (PRIMARY) ON o.position = r.p
SET o.state = 'dead',
    o.attempts = r.n,
    o.last_error = r.reason,
    o.dead_lettered_at = ?
WHERE o.state = 'pending'
