-- Live and dead tuples of the outbox table (bloat: dead rows vacuum has not removed), and
-- when autovacuum last ran. $1 = schema, $2 = table (plain names, as in the catalog).
SELECT n_live_tup, n_dead_tup, last_autovacuum, last_vacuum
FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname = $2
