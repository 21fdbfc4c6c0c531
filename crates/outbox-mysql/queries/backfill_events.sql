-- `outbox backfill`: one page of retained events of outbox table {{table}} by id (unique
-- key), each aggregate's in seq (commit) order, in the column layout of the claim
-- (src/poll.rs `decode`). ? = JSON array of ids. A row removed meanwhile by retention is
-- simply not returned.
SELECT o.position, o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload,
       o.headers, o.created_at, o.attempts, o.seq
FROM JSON_TABLE(?, '$[*]' COLUMNS (
        id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin PATH '$')) AS r
STRAIGHT_JOIN {{table}} AS o FORCE INDEX ({{name:_id_key}}) ON o.id = r.id
ORDER BY o.aggregate_type, o.aggregate_id, o.seq
