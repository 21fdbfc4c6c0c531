-- Collects planner statistics for the outbox table when it has never had any (reltuples < 0:
-- created or bulk-filled before autovacuum's first ANALYZE; and always for a partitioned
-- parent, which autovacuum never analyzes). Without them the claim can be planned as a scan
-- of the whole table. Cheap when statistics exist: one catalog lookup.
DO $$
BEGIN
    IF (SELECT c.reltuples < 0 FROM pg_class AS c WHERE c.oid = '{{table}}'::regclass) THEN
        ANALYZE {{table}};
    END IF;
END
$$
