-- The recovery of slot $1 is finished: $2 events were published from the table.
UPDATE {{qname:_cdc_offsets}}
SET recovery_done_at = now(), recovered_events = $2
WHERE slot = $1 AND recovery_from IS NOT NULL AND recovery_done_at IS NULL
