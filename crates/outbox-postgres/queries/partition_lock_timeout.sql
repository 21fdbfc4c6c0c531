-- Partitioned mode: partition DDL needs an ACCESS EXCLUSIVE lock on the outbox table, which
-- waits for the relay's open claim transactions and makes every later query wait behind it.
-- A short lock_timeout (this transaction only) bounds that stall; a rotation that cannot get
-- the lock in time gives up and runs again at the next interval. $1 = timeout, e.g. '2s'.
SELECT set_config('lock_timeout', $1, true)
