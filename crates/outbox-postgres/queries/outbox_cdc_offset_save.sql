-- Saves the CDC relay's acknowledged position for slot $1: $2 = LSN as a number, $3 = the
-- saving relay's id. Never moves it back, and writes nothing (no row returned) unless $3 still
-- owns the slot's row (migration 0008): a relay that lost the slot, even one whose save reaches
-- the server late, cannot change what the new owner resumed from.
--
-- It also rotates the acknowledged snapshot (migration 0007): the statement's snapshot and
-- the WAL insert position read after it become the pending pair; a pending pair whose
-- position the confirmed position has reached is promoted to `acked_snapshot` (every
-- transaction it sees ended at or before that position, so all were settled). The snapshot
-- is the statement's, taken before any function here runs: that order is what makes
-- "visible in the snapshot => ended at or before pending_lsn" hold.
--
-- Committed with synchronous_commit = local: with a synchronous standby down, the primary's
-- commits wait for it, and the relay must not wait with them (it holds what it streams for
-- the standby anyway, source.wait_for_standby). A save lost in a failover only means an older
-- acknowledged snapshot: more duplicates, never loss.
INSERT INTO {{qname:_cdc_offsets}} AS o
    (slot, confirmed_lsn, updated_at, pending_snapshot, pending_lsn, owner)
SELECT $1, $2, now(), pg_current_snapshot()::text,
       (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint, $3::uuid
FROM (SELECT set_config('synchronous_commit', 'local', true)) AS local_commit
ON CONFLICT (slot) DO UPDATE
SET confirmed_lsn = GREATEST(o.confirmed_lsn, excluded.confirmed_lsn),
    updated_at = excluded.updated_at,
    acked_snapshot = CASE WHEN o.pending_lsn <= excluded.confirmed_lsn
                          THEN o.pending_snapshot ELSE o.acked_snapshot END,
    pending_snapshot = CASE WHEN o.pending_lsn IS NULL OR o.pending_lsn <= excluded.confirmed_lsn
                            THEN excluded.pending_snapshot ELSE o.pending_snapshot END,
    pending_lsn = CASE WHEN o.pending_lsn IS NULL OR o.pending_lsn <= excluded.confirmed_lsn
                       THEN excluded.pending_lsn ELSE o.pending_lsn END
WHERE o.owner IS NOT DISTINCT FROM excluded.owner
RETURNING o.pending_lsn
