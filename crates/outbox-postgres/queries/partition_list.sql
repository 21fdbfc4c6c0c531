-- Partitioned mode: the partitions of the outbox table, and whether each is the DEFAULT one.
-- $1 = the outbox table's qualified, quoted name. pg_inherits is the catalog of partitions.
SELECT c.relname::text                                    AS name,
       coalesce(pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT', false) AS is_default
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1)
ORDER BY c.relname
