-- The recovery's upper snapshot, taken once the new slot exists (so every transaction it does
-- not see commits after the slot's start and is streamed by it). The statement's snapshot
-- comes before the WAL position read here. Kept if already set (the first taker wins).
UPDATE {{qname:_cdc_offsets}}
SET recovery_after = pg_current_snapshot()::text,
    recovery_after_lsn = (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint
WHERE slot = $1
  AND recovery_from IS NOT NULL
  AND recovery_done_at IS NULL
  AND recovery_after IS NULL
