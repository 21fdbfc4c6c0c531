-- Records one failed attempt per event and when to try again, one statement per batch.
-- The positions drive the join (STRAIGHT_JOIN, primary key): on a small table the optimizer
-- would rather scan it, and a scanning UPDATE waits on rows other replicas have claimed.
-- ? = JSON array of [position, next attempt 'YYYY-MM-DD hh:mm:ss.ffffff' UTC, error].
UPDATE JSON_TABLE(?, '$[*]' COLUMNS (
        p BIGINT PATH '$[0]',
        next_at DATETIME(6) PATH '$[1]',
        error TEXT CHARACTER SET utf8mb4 PATH '$[2]')) AS r
STRAIGHT_JOIN {{table}} AS o FORCE INDEX (PRIMARY) ON o.position = r.p
SET o.attempts = o.attempts + 1,
    o.next_attempt_at = r.next_at,
    o.last_error = r.error
WHERE o.state = 'pending'
