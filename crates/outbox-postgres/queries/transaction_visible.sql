-- Whether every transaction in $1 (32-bit xids from the replication stream) is visible to a
-- new snapshot. Logical decoding may send a commit before the committing backend has left
-- the proc array, so a query right after it could still miss that transaction's rows. The
-- 32-bit xids are widened to xid8 with the epoch of the snapshot's xmax.
WITH m AS (
    SELECT snap, pg_snapshot_xmax(snap)::text::bigint AS xmax
    FROM (SELECT pg_current_snapshot() AS snap) AS s
)
SELECT coalesce(bool_and(pg_visible_in_snapshot(
           (CASE WHEN (((m.xmax >> 32) << 32) | x) > m.xmax
                 THEN (((m.xmax >> 32) << 32) | x) - 4294967296
                 ELSE (((m.xmax >> 32) << 32) | x) END)::text::xid8,
           m.snap)), true)
FROM m, unnest($1::bigint[]) AS x
