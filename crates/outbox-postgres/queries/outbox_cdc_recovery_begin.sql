-- Slot $1 is gone: records the recovery before the slot is created again, so that whoever
-- streams from the new slot (this relay, another, after a crash) first publishes from the
-- table what was not acknowledged. Runs only while the slot is still missing (a relay that
-- saw it missing a moment ago must not undo a recovery that has begun). A recovery still in
-- progress keeps its starting snapshot (older, so it covers more); the new slot needs a new
-- `recovery_after`. The saved position belongs to the lost slot: reset, or the new slot's
-- transactions would be skipped as acknowledged. Returns the lost slot's saved position.
UPDATE {{qname:_cdc_offsets}} AS o
SET recovery_from = CASE WHEN o.recovery_from IS NOT NULL AND o.recovery_done_at IS NULL
                         THEN o.recovery_from ELSE o.acked_snapshot END,
    recovery_from_lsn = CASE WHEN o.recovery_from IS NOT NULL AND o.recovery_done_at IS NULL
                             THEN o.recovery_from_lsn ELSE o.confirmed_lsn END,
    recovery_started_at = CASE WHEN o.recovery_from IS NOT NULL AND o.recovery_done_at IS NULL
                               THEN o.recovery_started_at ELSE now() END,
    recovery_after = NULL,
    recovery_after_lsn = NULL,
    recovery_done_at = NULL,
    recovered_events = NULL,
    confirmed_lsn = 0,
    pending_snapshot = NULL,
    pending_lsn = NULL,
    updated_at = now()
WHERE o.slot = $1
  AND o.acked_snapshot IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)
RETURNING o.recovery_from_lsn
