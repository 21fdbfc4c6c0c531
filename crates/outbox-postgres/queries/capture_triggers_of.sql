-- `outbox capture install|remove`: the triggers that call a capture's function ($1, its
-- signature as text, e.g. '"public"."bookings_outbox_capture"()'), each with its table as
-- `schema.table` and the statement that drops it. The names come from the catalog and are
-- quoted by the server (%I), never by us. Triggers cloned onto partitions go with their
-- parent's.
SELECT t.tgname::text AS trigger,
       n.nspname || '.' || c.relname AS table_name,
       format('DROP TRIGGER %I ON %I.%I', t.tgname, n.nspname, c.relname) AS drop_sql
FROM pg_catalog.pg_trigger AS t
JOIN pg_catalog.pg_class AS c ON c.oid = t.tgrelid
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE t.tgfoid = to_regprocedure($1) AND t.tgparentid = 0
ORDER BY 2, 1
