-- `outbox backfill`: takes the held aggregates' pending rows that must follow a backfilled
-- event out of subscription table {{table}}, to insert them again behind it
-- (backfill_insert.sql) in the same transaction. Deleted rather than renumbered in place, as
-- on PostgreSQL: a claim that started before this commit finds them gone, never renumbered
-- under it. ? = JSON array of ids (locked by backfill_pending.sql).
DELETE s
FROM JSON_TABLE(?, '$[*]' COLUMNS (
        id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin PATH '$')) AS r
STRAIGHT_JOIN {{table}} AS s FORCE INDEX ({{name:_id_key}}) ON s.id = r.id
WHERE s.state = 'pending'
