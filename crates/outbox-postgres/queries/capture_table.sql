-- `outbox capture install`: the business table by schema ($1) and name ($2), and its kind
-- (r = table, p = partitioned table; a view or a foreign table is refused).
SELECT c.oid::bigint AS oid, c.relkind::text AS kind
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2
