-- `outbox backfill`, under the hold: before the pending rows that must follow a backfilled
-- event are taken out (backfill_delete_pending.sql), moves each aggregate's head in
-- {{name:_aggregate_heads}} back to the number before the first of them, so that the insert
-- trigger of subscription table {{table}} numbers the backfilled events and the re-inserted
-- rows on from there: `seq` (the `aggregate_seq` header) stays 1, 2, 3, ... with no gap,
-- in the new order. They are the aggregate's last numbers: the claim hands an aggregate out
-- only from its first pending row. ? = JSON array of ids.
UPDATE {{name:_aggregate_heads}} AS h
JOIN (SELECT s.aggregate_type, s.aggregate_id, MIN(s.seq) - 1 AS base
      FROM JSON_TABLE(?, '$[*]' COLUMNS (
        id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin PATH '$')) AS r
      STRAIGHT_JOIN {{table}} AS s FORCE INDEX ({{name:_id_key}}) ON s.id = r.id
      WHERE s.state = 'pending'
      GROUP BY s.aggregate_type, s.aggregate_id) AS d
  ON h.aggregate_type = d.aggregate_type AND h.aggregate_id = d.aggregate_id
SET h.last_seq = d.base
