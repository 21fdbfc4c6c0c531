-- `outbox capture install`: the columns of the business table ($1 = its oid), with their
-- type and, for a domain, the type it is based on (what decides a usable payload column).
SELECT a.attname::text AS name,
       pg_catalog.format_type(a.atttypid, a.atttypmod) AS type,
       pg_catalog.format_type(COALESCE(NULLIF(t.typbasetype, 0), t.oid), NULL) AS base_type
FROM pg_catalog.pg_attribute AS a
JOIN pg_catalog.pg_type AS t ON t.oid = a.atttypid
WHERE a.attrelid = ($1::bigint)::oid AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
