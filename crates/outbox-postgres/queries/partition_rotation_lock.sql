-- Partitioned mode: one rotation at a time per outbox table. Several relay replicas run the
-- retention schedule; without this two of them could create or detach the same partition at
-- once (one would fail). Transaction-scoped, so it can never outlive its transaction, even if
-- the run is cancelled. $1 = "outbox retention <table>". True when this transaction has it.
SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))
