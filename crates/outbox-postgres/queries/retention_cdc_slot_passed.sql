-- Retention (CDC mode), step 2: whether the slot has confirmed everything up to $2 (the
-- `lsn` of retention_cdc_horizon.sql). $1 = slot name. NULL when the slot does not exist.
SELECT confirmed_flush_lsn >= $2::pg_lsn, confirmed_flush_lsn::text
FROM pg_replication_slots
WHERE slot_name = $1
