-- The outbox table's layout: 'p' partitioned, 'r' plain, NULL missing. $1 = the table's
-- qualified, quoted name.
SELECT c.relkind::text FROM pg_class AS c WHERE c.oid = to_regclass($1)
