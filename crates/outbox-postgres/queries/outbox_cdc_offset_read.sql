-- What the CDC relay saved for slot $1 (no row: never saved): the acknowledged position,
-- whether an acknowledged snapshot exists, and the last slot recovery (migration 0007).
SELECT confirmed_lsn,
       acked_snapshot IS NOT NULL AS has_snapshot,
       recovery_from,
       recovery_after,
       recovery_after_lsn,
       recovery_from_lsn,
       recovery_started_at,
       recovery_done_at,
       recovered_events
FROM {{qname:_cdc_offsets}}
WHERE slot = $1
