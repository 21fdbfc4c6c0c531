-- `outbox backfill`: what subscription table {{table}} already handed out per aggregate:
-- the newest outbox seq among its delivered or dead-lettered rows still there (`last_seq`,
-- NULL when their outbox rows are gone: older than anything retained), whether any such row
-- is there (`rows`), and whether its delivery-position head moved (`positioned`: something
-- was handed out, maybe since removed). $1 aggregate types, $2 aggregate ids.
WITH wanted AS (
    SELECT * FROM unnest($1::text[], $2::text[]) AS w (aggregate_type, aggregate_id)
)
SELECT w.aggregate_type, w.aggregate_id,
       (SELECT max(o.seq)
        FROM {{table}} AS s
        JOIN {{schema}}.{{outbox}} AS o ON o.id = s.id
        WHERE s.aggregate_type = w.aggregate_type AND s.aggregate_id = w.aggregate_id
          AND s.state <> 'pending') AS last_seq,
       EXISTS (SELECT 1
               FROM {{table}} AS s
               WHERE s.aggregate_type = w.aggregate_type AND s.aggregate_id = w.aggregate_id
                 AND s.state <> 'pending') AS rows,
       COALESCE((SELECT p.last_position > 0
                 FROM {{qname:_aggregate_positions}} AS p
                 WHERE p.aggregate_type = w.aggregate_type
                   AND p.aggregate_id = w.aggregate_id), false) AS positioned
FROM wanted AS w
