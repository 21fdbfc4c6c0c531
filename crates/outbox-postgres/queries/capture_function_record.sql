-- `outbox capture install|remove`: whether a capture's function ($1, its signature as text)
-- exists, and the record written next to it at install (its comment), which says which
-- outbox table it writes into.
SELECT pg_catalog.obj_description(to_regprocedure($1), 'pg_proc') AS record
WHERE to_regprocedure($1) IS NOT NULL
