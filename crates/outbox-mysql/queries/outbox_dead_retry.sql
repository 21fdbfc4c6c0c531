-- Puts dead letters back in line: pending, attempts reset, ready at once. `seq` is kept, so a
-- retried event is still ahead of the later events of its aggregate (which waited behind it
-- under dead_letter = hold-aggregate) and is delivered first. ? = JSON array of positions.
UPDATE JSON_TABLE(?, '$[*]' COLUMNS (p BIGINT PATH '$')) AS d
STRAIGHT_JOIN {{table}} AS o FORCE INDEX (PRIMARY) ON o.position = d.p
SET o.state = 'pending', o.attempts = 0, o.next_attempt_at = '1970-01-01 00:00:01',
    o.dead_lettered_at = NULL
WHERE o.state = 'dead'
