-- The aggregates of a claimed batch that must wait: an event before the batch's first event
-- of the aggregate is still pending (locked by another replica's claim, or not ready), or
-- dead while dead letters hold their aggregate. A plain read in the claim transaction: under
-- READ COMMITTED it sees every committed row, also rows other replicas have locked.
-- ? = JSON array of [aggregate_type, aggregate_id, first claimed seq],
-- ? = 1 when a dead letter holds its aggregate.
SELECT b.t, b.i
FROM JSON_TABLE(?, '$[*]' COLUMNS (
        t VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
        i VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[1]',
        s BIGINT PATH '$[2]')) AS b
WHERE EXISTS (
          SELECT 1
          FROM {{table}} AS e
          WHERE e.aggregate_type = b.t AND e.aggregate_id = b.i
            AND e.state = 'pending' AND e.seq < b.s)
   OR (? AND EXISTS (
          SELECT 1
          FROM {{table}} AS e
          WHERE e.aggregate_type = b.t AND e.aggregate_id = b.i
            AND e.state = 'dead' AND e.seq < b.s))
