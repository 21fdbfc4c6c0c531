-- 0007: what the CDC relay has acknowledged, as a snapshot, so that a lost slot (a failover
-- to a standby before PostgreSQL 17, a dropped or invalidated slot) is recovered exactly from
-- the table (docs/cdc.md, "Failover").
--
-- An LSN cannot say which rows were acknowledged once the slot that gave it meaning is gone;
-- a snapshot can, and a physical standby has the same transaction ids. Every save of the
-- position (at most every 100 ms) also records `pending_snapshot`, the server's snapshot, and
-- `pending_lsn`, the WAL insert position read after it: every transaction visible in that
-- snapshot ended at or before `pending_lsn`. Once the relay's confirmed position (through
-- settled events) reaches `pending_lsn`, the snapshot is promoted to `acked_snapshot`: every
-- transaction visible in it was published or dead-lettered (or predates the slot).
--
-- `recovery_*` describe the last recovery: `recovery_from` is the acknowledged snapshot at the
-- loss; `recovery_after`, a snapshot taken once the new slot existed (every transaction it
-- sees is published from the table, and skipped when the new slot streams it);
-- `recovery_after_lsn` the WAL position after it. Set `recovery_done_at` means finished.
ALTER TABLE {{qname:_cdc_offsets}}
    ADD COLUMN IF NOT EXISTS acked_snapshot      text,
    ADD COLUMN IF NOT EXISTS pending_snapshot    text,
    ADD COLUMN IF NOT EXISTS pending_lsn         bigint,
    ADD COLUMN IF NOT EXISTS recovery_from       text,
    ADD COLUMN IF NOT EXISTS recovery_from_lsn   bigint,
    ADD COLUMN IF NOT EXISTS recovery_after      text,
    ADD COLUMN IF NOT EXISTS recovery_after_lsn  bigint,
    ADD COLUMN IF NOT EXISTS recovery_started_at timestamptz,
    ADD COLUMN IF NOT EXISTS recovery_done_at    timestamptz,
    ADD COLUMN IF NOT EXISTS recovered_events    bigint;
