-- Puts delivered events back in line, same ids and same `seq` (each goes out again in its
-- aggregate's order, before the aggregate's later pending events). ? = JSON array of ids.
-- The ids drive the join (unique key), so nothing else is read or locked.
UPDATE JSON_TABLE(?, '$[*]' COLUMNS (
        i CHAR(36) CHARACTER SET ascii COLLATE ascii_bin PATH '$')) AS r
STRAIGHT_JOIN {{table}} AS o FORCE INDEX ({{name:_id_key}}) ON o.id = r.i
SET o.state = 'pending', o.attempts = 0, o.next_attempt_at = '1970-01-01 00:00:01',
    o.delivered_at = NULL, o.last_error = NULL
WHERE o.state = 'delivered'
