-- `outbox capture list`: every capture function in the outbox table's schema ($1), with the
-- record written next to it at install (its comment: which outbox table it writes into, and
-- the [[capture]] entry) and the trigger that calls it, if any, on `schema.table`. tgtype
-- bits: 4 = INSERT, 16 = UPDATE; tgenabled 'D' = disabled.
SELECT p.proname::text AS function_name,
       pg_catalog.obj_description(p.oid, 'pg_proc') AS record,
       t.tgname::text AS trigger,
       tn.nspname || '.' || tc.relname AS table_name,
       COALESCE((t.tgtype & 4) <> 0, false) AS on_insert,
       COALESCE((t.tgtype & 16) <> 0, false) AS on_update,
       COALESCE(t.tgenabled <> 'D', false) AS enabled
FROM pg_catalog.pg_proc AS p
JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
LEFT JOIN pg_catalog.pg_trigger AS t ON t.tgfoid = p.oid AND t.tgparentid = 0
LEFT JOIN pg_catalog.pg_class AS tc ON tc.oid = t.tgrelid
LEFT JOIN pg_catalog.pg_namespace AS tn ON tn.oid = tc.relnamespace
WHERE n.nspname = $1
  AND p.proname LIKE '%\_outbox\_capture'
  AND p.pronargs = 0
  AND p.prorettype = 'pg_catalog.trigger'::pg_catalog.regtype
ORDER BY p.proname, 4, 3
