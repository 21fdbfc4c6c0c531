-- `outbox backfill`: what subscription table {{table}} already handed out per aggregate:
-- the newest seq in outbox table {{outbox}} among its delivered or dead-lettered rows still
-- there (`last_seq`, NULL when their outbox rows are gone: older than anything retained),
-- whether any such row is there (`rows`), and whether its delivery-position head moved
-- (`positioned`: something was handed out, maybe since removed).
-- The subscription table has no aggregate index: one scan of it serves every aggregate of
-- the chunk (a LEFT JOIN keeps the subscription's rows driving, each outbox row found by id).
-- ?1 = JSON array of [aggregate_type, aggregate_id].
WITH wanted AS (
    SELECT j.value ->> 0 AS aggregate_type, j.value ->> 1 AS aggregate_id
    FROM json_each(?1) AS j
),
handed AS (
    SELECT s.aggregate_type, s.aggregate_id, max(o.seq) AS last_seq
    FROM {{table}} AS s
    LEFT JOIN {{outbox}} AS o ON o.id = s.id
    WHERE s.state <> 'pending'
      AND (s.aggregate_type, s.aggregate_id) IN (SELECT aggregate_type, aggregate_id FROM wanted)
    GROUP BY s.aggregate_type, s.aggregate_id
)
SELECT w.aggregate_type, w.aggregate_id, h.last_seq, h.aggregate_id IS NOT NULL AS rows,
       coalesce((SELECT p.last_position > 0
                 FROM {{name:_aggregate_positions}} AS p
                 WHERE p.aggregate_type = w.aggregate_type
                   AND p.aggregate_id = w.aggregate_id), 0) AS positioned
FROM wanted AS w
LEFT JOIN handed AS h
  ON h.aggregate_type = w.aggregate_type AND h.aggregate_id = w.aggregate_id
