-- `outbox capture snapshot`, after a chunk's insert in the same transaction (no writer can
-- have changed the table since): the storage class and value of the chunk's last key, the
-- ?2-th (0-based) row after the recorded key ?1 in key order (@AFTER@ as in
-- capture_snapshot_chunk.sql).
SELECT typeof(NEW.{{key_column}}), NEW.{{key_column}}
FROM {{captured_table}} AS "NEW"
WHERE @AFTER@
ORDER BY NEW.{{key_column}}
LIMIT 1 OFFSET ?2
