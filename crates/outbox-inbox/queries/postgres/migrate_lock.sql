-- `migrate`'s lock: a transaction-scoped advisory lock named after the table ($1), so a
-- concurrent `migrate` waits and then finds nothing to do. Released at commit.
SELECT pg_advisory_xact_lock(hashtextextended($1, 0))
