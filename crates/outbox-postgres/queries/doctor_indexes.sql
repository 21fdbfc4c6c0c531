-- Indexes of the outbox table and whether each is valid (a failed CREATE INDEX
-- CONCURRENTLY leaves an invalid one that the planner ignores). $1 = the table as a
-- qualified, quoted name (text, resolved by to_regclass).
SELECT c.relname::text, i.indisvalid
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass($1)
ORDER BY c.relname
