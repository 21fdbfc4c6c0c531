-- Partitioned mode: the DDL that detaches one partition (built by the server's format(),
-- %I-quoted). Runs in the rotation transaction, which checks the detached table for
-- undelivered rows before dropping it, and rolls back (re-attaching it) if it finds any.
-- $1 schema, $2 partition name.
SELECT format('ALTER TABLE {{table}} DETACH PARTITION %I.%I', $1::text, $2::text)
