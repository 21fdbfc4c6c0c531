-- `outbox capture snapshot`: the primary-key columns of the table with oid $1, in key order
-- (none: no primary key; a snapshot follows a single-column key only).
SELECT a.attname::text
FROM pg_catalog.pg_index AS i
JOIN pg_catalog.pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
WHERE i.indrelid = ($1::bigint)::oid AND i.indisprimary
ORDER BY pg_catalog.array_position(i.indkey::int2[], a.attnum)
