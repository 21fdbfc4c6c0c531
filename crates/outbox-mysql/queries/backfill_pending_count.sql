-- `outbox backfill`: how many pending rows each held aggregate has in subscription table
-- {{table}}, locked or not (a plain read, index *_aggregate_idx). More than the backfill
-- locked means a relay has one in flight. ? = JSON array of [aggregate_type, aggregate_id].
SELECT w.t, w.i,
       (SELECT COUNT(*) FROM {{table}} AS s FORCE INDEX ({{name:_aggregate_idx}})
        WHERE s.aggregate_type = w.t AND s.aggregate_id = w.i AND s.state = 'pending') AS n
FROM JSON_TABLE(?, '$[*]' COLUMNS (
        t VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
        i VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[1]')) AS w
