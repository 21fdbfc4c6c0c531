-- `outbox backfill`: the seq (per-aggregate commit order) of these events in outbox table
-- {{table}} (unique key; a plain read: nothing in the outbox is locked). An event whose
-- outbox row retention removed is not returned. ? = JSON array of ids.
SELECT o.id, o.seq
FROM JSON_TABLE(?, '$[*]' COLUMNS (
        id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin PATH '$')) AS r
STRAIGHT_JOIN {{table}} AS o FORCE INDEX ({{name:_id_key}}) ON o.id = r.id
