-- `outbox capture install`: the function (as `schema.name`) that a trigger named $2 on the
-- table with oid $1 calls, if there is such a trigger: one other than the capture's own
-- function is a name clash.
SELECT pn.nspname || '.' || p.proname
FROM pg_catalog.pg_trigger AS t
JOIN pg_catalog.pg_proc AS p ON p.oid = t.tgfoid
JOIN pg_catalog.pg_namespace AS pn ON pn.oid = p.pronamespace
WHERE t.tgrelid = ($1::bigint)::oid AND t.tgname = $2
