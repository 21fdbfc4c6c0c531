-- Dead-letters events: kept, queryable, retryable (`outbox dead retry`).
-- The positions drive the join (STRAIGHT_JOIN, primary key): on a small table the optimizer
-- would rather scan it, and a scanning UPDATE waits on rows other replicas have claimed.
-- ? = JSON array of [position, reason], ? = now.
UPDATE JSON_TABLE(?, '$[*]' COLUMNS (
        p BIGINT PATH '$[0]',
        reason TEXT CHARACTER SET utf8mb4 PATH '$[1]')) AS r
STRAIGHT_JOIN {{table}} AS o FORCE INDEX (PRIMARY) ON o.position = r.p
SET o.state = 'dead',
    o.attempts = o.attempts + 1,
    o.last_error = r.reason,
    o.dead_lettered_at = ?
WHERE o.state = 'pending'
