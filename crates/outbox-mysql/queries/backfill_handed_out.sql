-- `outbox backfill`: what subscription table {{table}} already handed out per aggregate:
-- the newest seq in outbox table {{outbox}} among its delivered or dead-lettered rows still
-- there (`last_seq`, NULL when their outbox rows are gone: older than anything retained),
-- whether any such row is there (`rows`), and whether its numbering moved past its pending
-- rows (`positioned`: something was handed out, maybe since removed; the claim hands an
-- aggregate out only from its first pending row, so its pending rows hold its last numbers).
-- ? = JSON array of [aggregate_type, aggregate_id].
SELECT w.t, w.i,
       (SELECT MAX(o.seq)
        FROM {{table}} AS s FORCE INDEX ({{name:_aggregate_idx}})
        JOIN {{outbox}} AS o ON o.id = s.id
        WHERE s.aggregate_type = w.t AND s.aggregate_id = w.i
          AND s.state <> 'pending') AS last_seq,
       EXISTS (SELECT 1
               FROM {{table}} AS s FORCE INDEX ({{name:_aggregate_idx}})
               WHERE s.aggregate_type = w.t AND s.aggregate_id = w.i
                 AND s.state <> 'pending') AS has_rows,
       COALESCE((SELECT h.last_seq FROM {{name:_aggregate_heads}} AS h
                 WHERE h.aggregate_type = w.t AND h.aggregate_id = w.i), 0)
         > (SELECT COUNT(*) FROM {{table}} AS s FORCE INDEX ({{name:_aggregate_idx}})
            WHERE s.aggregate_type = w.t AND s.aggregate_id = w.i
              AND s.state = 'pending') AS positioned
FROM JSON_TABLE(?, '$[*]' COLUMNS (
        t VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
        i VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[1]')) AS w
