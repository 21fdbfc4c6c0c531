-- The CDC slot as a PostgreSQL 17 failover slot (`source.failover_slot = true`): the server
-- synchronizes it to the physical standbys listed in `synchronized_standby_slots` (with
-- `sync_replication_slots = on` on them), so a promoted standby has it. Arguments after the
-- plugin: temporary = false, two-phase = false, failover = true. $1 = slot name.
SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)
