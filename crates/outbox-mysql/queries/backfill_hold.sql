-- `outbox backfill`, in the chunk's transaction: locks, without waiting, the head rows of
-- the chunk's aggregates in {{name:_aggregate_heads}}: the row that the insert trigger of
-- subscription table {{table}} upserts for every copy the fan-out makes (and that producers
-- lock the same way in the outbox). While the backfill holds it, no fan-out can add a row
-- of the aggregate to the table (its insert waits). SKIP LOCKED: an aggregate a fan-out is
-- copying now is tried again later, and a fan-out holding several aggregates cannot
-- deadlock with the backfill. Returns the aggregates now held.
-- ? = JSON array of [aggregate_type, aggregate_id].
SELECT h.aggregate_type, h.aggregate_id
FROM JSON_TABLE(?, '$[*]' COLUMNS (
        t VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]',
        i VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[1]')) AS w
STRAIGHT_JOIN {{name:_aggregate_heads}} AS h FORCE INDEX (PRIMARY)
    ON h.aggregate_type = w.t AND h.aggregate_id = w.i
FOR UPDATE SKIP LOCKED
