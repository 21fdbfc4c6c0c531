-- Partitioned mode: the DDL that drops one detached partition (%I-quoted by format()).
-- $1 schema, $2 partition name.
SELECT format('DROP TABLE %I.%I', $1::text, $2::text)
