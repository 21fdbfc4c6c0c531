-- Creates the CDC slot with the pgoutput plugin. Must run outside a transaction that wrote
-- anything (a PostgreSQL rule), so `setup_cdc` runs it on its own. It waits for transactions
-- already running to finish (the slot needs a consistent starting point). $1 = slot name.
SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')
