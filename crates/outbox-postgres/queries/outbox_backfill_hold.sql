-- `outbox backfill`, in the chunk's transaction on subscription table {{table}}: takes,
-- without waiting, the per-aggregate advisory lock that the table's insert trigger takes
-- (same key: schema.table, aggregate type, aggregate id; see 0001_outbox_table.sql). While it
-- is held, the fan-out cannot copy a new event of the aggregate into the table (its insert
-- waits), so no pending row of the aggregate appears behind the backfill's back. Not waiting
-- means no deadlock with a fan-out that holds several aggregates: an aggregate whose lock is
-- taken is tried again later. $1 aggregate types, $2 aggregate ids (sorted), $3 the table as
-- the trigger names it (`schema.table`, unquoted). Returns the aggregates now held.
SELECT a.aggregate_type, a.aggregate_id
FROM unnest($1::text[], $2::text[]) AS a (aggregate_type, aggregate_id)
WHERE pg_try_advisory_xact_lock(hashtextextended(
    $3 || chr(31) || a.aggregate_type || chr(31) || a.aggregate_id, 0))
