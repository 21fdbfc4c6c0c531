-- The CDC slot as the server sees it, for the relay's start check, the slot-lag metric and
-- `outbox status`. $1 = slot name. pg_replication_slots is a small in-memory view.
-- retained_wal_bytes: WAL after the confirmed flush position (what a restart replays and what
-- the relay has not confirmed); restart_lag_bytes: WAL the server keeps on disk for the slot.
SELECT s.plugin,
       s.slot_type,
       s.database,
       s.active,
       s.active_pid,
       s.wal_status,
       s.confirmed_flush_lsn::text                                          AS confirmed_flush_lsn,
       (pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint               AS retained_wal_bytes,
       (pg_current_wal_lsn() - s.restart_lsn)::bigint                       AS restart_lag_bytes,
       s.safe_wal_size
FROM pg_replication_slots AS s
WHERE s.slot_name = $1
