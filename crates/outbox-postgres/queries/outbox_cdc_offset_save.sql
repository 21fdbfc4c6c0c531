-- Saves the CDC relay's acknowledged position for slot $1: $2 = LSN as a number. Never moves
-- it back (a stale writer, e.g. a relay that lost the slot, cannot undo a newer save).
INSERT INTO {{qname:_cdc_offsets}} AS o (slot, confirmed_lsn, updated_at)
VALUES ($1, $2, now())
ON CONFLICT (slot) DO UPDATE
SET confirmed_lsn = GREATEST(o.confirmed_lsn, excluded.confirmed_lsn),
    updated_at = excluded.updated_at
