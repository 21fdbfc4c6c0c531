-- `outbox backfill`: what subscription table {{table}} already handed out per aggregate:
-- the newest seq in outbox table {{outbox}} among its delivered or dead-lettered rows still
-- there (`last_seq`, NULL when their outbox rows are gone: older than anything retained),
-- whether any such row is there (`rows`), and whether its delivery-position head moved
-- (`positioned`: something was handed out, maybe since removed).
-- CROSS JOIN: the subscription's rows drive the join (SQLite keeps that order), each outbox
-- row found by its id; the planner would rather scan the outbox. The subscription table has
-- no aggregate index: its rows are scanned once per aggregate.
-- ?1 = JSON array of [aggregate_type, aggregate_id].
WITH wanted AS (
    SELECT j.value ->> 0 AS aggregate_type, j.value ->> 1 AS aggregate_id
    FROM json_each(?1) AS j
)
SELECT w.aggregate_type, w.aggregate_id,
       (SELECT max(o.seq)
        FROM {{table}} AS s
        CROSS JOIN {{outbox}} AS o ON o.id = s.id
        WHERE s.aggregate_type = w.aggregate_type AND s.aggregate_id = w.aggregate_id
          AND s.state <> 'pending') AS last_seq,
       EXISTS (SELECT 1
               FROM {{table}} AS s
               WHERE s.aggregate_type = w.aggregate_type AND s.aggregate_id = w.aggregate_id
                 AND s.state <> 'pending') AS rows,
       coalesce((SELECT p.last_position > 0
                 FROM {{name:_aggregate_positions}} AS p
                 WHERE p.aggregate_type = w.aggregate_type
                   AND p.aggregate_id = w.aggregate_id), 0) AS positioned
FROM wanted AS w
