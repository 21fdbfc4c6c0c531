-- Retention (CDC mode), step 1: an observation of the server. Every transaction with an xid
-- below `xmin` (the oldest transaction still running) has ended, and its commit record was
-- written to the WAL before this statement read the WAL insert position `lsn`. Once the
-- slot's confirmed_flush_lsn reaches `lsn`, every such transaction has been streamed and
-- settled for good by the relay (the CDC source confirms a transaction only when it and all
-- earlier ones are delivered or dead-lettered; docs/cdc.md). The snapshot is taken first,
-- the position second (target-list order), which is what makes the argument hold.
-- `xmin` is returned as its 32-bit xid (what a row's xmin column holds) and as xid8 text.
SELECT (pg_snapshot_xmin(s.snap)::text::numeric % 4294967296)::bigint AS xmin32,
       pg_current_wal_insert_lsn()::text                               AS lsn
FROM (SELECT pg_current_snapshot() AS snap) AS s
