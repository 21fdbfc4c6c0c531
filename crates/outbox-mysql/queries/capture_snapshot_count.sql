-- `outbox capture snapshot` start: the rows after the recorded key (@AFTER@ as in
-- capture_snapshot_keys.sql), for the progress display. Not locked: the table changes while
-- the snapshot runs.
SELECT COUNT(*)
FROM {{captured_table}} AS `NEW`
WHERE @AFTER@
