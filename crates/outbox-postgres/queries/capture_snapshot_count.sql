-- `outbox capture snapshot` start: the rows after the recorded key ($1, jsonb text or NULL;
-- $2 the key column's name), for the progress display. Not locked: the table changes while
-- the snapshot runs.
SELECT count(*)
FROM {{captured_schema}}.{{captured_table}} AS t
WHERE $1::text IS NULL
   OR t.{{key_column}} > (pg_catalog.jsonb_populate_record(
          NULL::{{captured_schema}}.{{captured_table}},
          pg_catalog.jsonb_build_object($2::text, $1::text::jsonb))).{{key_column}}
