-- Collects planner statistics for the outbox table when it has never had any (reltuples < 0)
-- and already holds a backlog (at least 1,000 rows): a table bulk-filled before autovacuum's
-- first ANALYZE, or a partitioned parent, which autovacuum never analyzes. Without them the
-- first claims can be planned as scans of the whole table. A small or empty table is left
-- alone: statistics taken now would say "empty" while producers fill it, and a never-analyzed
-- table is estimated from its current size, which grows with it. Cheap when statistics exist
-- (one catalog lookup) and on a small table (at most 1,000 rows read).
DO $$
BEGIN
    IF (SELECT c.reltuples < 0 FROM pg_class AS c WHERE c.oid = '{{table}}'::regclass)
       AND EXISTS (SELECT 1 FROM {{table}} OFFSET 999) THEN
        ANALYZE {{table}};
    END IF;
END
$$
