-- A slot recovery's events (docs/cdc.md, "Failover"): the pending rows whose inserting
-- transaction is visible in $2 (the snapshot taken once the new slot existed) and not in $1
-- (the last acknowledged snapshot), in seq order (commit order within an aggregate).
--
-- Visibility in a snapshot S: the transaction id precedes S's xmax and is not among its
-- in-progress ids. Ids are compared as 32-bit xids through age(), which measures both from the
-- same newest id: right for every row younger than 2^31 transactions, as CDC retention
-- assumes too (queries/retention_cdc_delete_batch.sql). A row older than that can only be
-- published once more, never skipped: both snapshots are recent.
WITH s AS (
    SELECT (pg_snapshot_xmax($1::pg_snapshot)::text::numeric % 4294967296)::text::xid AS from_xmax,
           ARRAY(SELECT (x::text::numeric % 4294967296)::bigint
                 FROM pg_snapshot_xip($1::pg_snapshot) AS x)                          AS from_xip,
           (pg_snapshot_xmax($2::pg_snapshot)::text::numeric % 4294967296)::text::xid AS after_xmax,
           ARRAY(SELECT (x::text::numeric % 4294967296)::bigint
                 FROM pg_snapshot_xip($2::pg_snapshot) AS x)                          AS after_xip
)
SELECT o.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers,
       o.created_at, o.attempts, o.last_error IS NOT NULL AS had_error,
       o.xmin::text::bigint AS xid
FROM {{table}} AS o, s
WHERE o.state = 'pending'
  AND age(o.xmin) > age(s.after_xmax)
  AND o.xmin::text::bigint <> ALL (s.after_xip)
  AND NOT (age(o.xmin) > age(s.from_xmax) AND o.xmin::text::bigint <> ALL (s.from_xip))
ORDER BY o.seq
