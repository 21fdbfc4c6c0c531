-- `outbox backfill`: which of these event ids subscription table {{table}} holds (unique
-- key), in any state. ? = JSON array of ids.
SELECT o.id
FROM JSON_TABLE(?, '$[*]' COLUMNS (
        id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin PATH '$')) AS r
STRAIGHT_JOIN {{table}} AS o FORCE INDEX ({{name:_id_key}}) ON o.id = r.id
