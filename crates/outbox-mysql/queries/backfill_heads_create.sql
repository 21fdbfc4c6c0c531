-- `outbox backfill`, in the chunk's transaction: creates the missing head rows of the
-- chunk's aggregates in {{name:_aggregate_heads}} (the rows the insert trigger of
-- subscription table {{table}} numbers from) at 0, so that each aggregate has a row to lock
-- (backfill_hold.sql). The trigger's upsert counts on from 0 as from a missing row. The
-- NOT EXISTS is a plain read (READ COMMITTED), so only new aggregates are written.
-- ? = JSON array of [aggregate_type, aggregate_id].
INSERT IGNORE INTO {{name:_aggregate_heads}} (aggregate_type, aggregate_id, last_seq)
SELECT w.t, w.i, 0
FROM JSON_TABLE(?, '$[*]' COLUMNS (
        t VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
        i VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[1]')) AS w
WHERE NOT EXISTS (SELECT 1 FROM {{name:_aggregate_heads}} AS h
                  WHERE h.aggregate_type = w.t AND h.aggregate_id = w.i)
