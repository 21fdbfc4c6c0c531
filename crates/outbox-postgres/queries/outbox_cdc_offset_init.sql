-- Records the starting point of a slot that `migrate` is about to create for the first time:
-- $2, a snapshot taken before the slot exists (every transaction it sees committed before
-- the slot's start, so the slot never streams it: it counts as handled). Replaces whatever
-- an older namesake left. $1 = slot.
INSERT INTO {{qname:_cdc_offsets}} AS o (slot, confirmed_lsn, updated_at, acked_snapshot)
VALUES ($1, 0, now(), $2)
ON CONFLICT (slot) DO UPDATE
SET confirmed_lsn = 0, updated_at = now(), acked_snapshot = $2,
    pending_snapshot = NULL, pending_lsn = NULL,
    recovery_from = NULL, recovery_from_lsn = NULL, recovery_after = NULL,
    recovery_after_lsn = NULL, recovery_started_at = NULL, recovery_done_at = NULL,
    recovered_events = NULL, owner = NULL
