-- `outbox capture snapshot` start: the rows after the recorded key (@AFTER@ as in
-- capture_snapshot_chunk.sql, the key ?1), for the progress display. The table changes while
-- the snapshot runs.
SELECT count(*)
FROM {{captured_table}} AS "NEW"
WHERE @AFTER@
