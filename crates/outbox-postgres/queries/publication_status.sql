-- Whether the CDC publication exists, publishes inserts, and includes the outbox table.
-- $1 = publication, $2 = schema, $3 = table.
SELECT p.pubinsert,
       EXISTS (SELECT 1 FROM pg_publication_tables AS t
               WHERE t.pubname = p.pubname AND t.schemaname = $2 AND t.tablename = $3) AS has_table,
       (p.pubupdate OR p.pubdelete OR p.pubtruncate)                                    AS publishes_more
FROM pg_publication AS p
WHERE p.pubname = $1
