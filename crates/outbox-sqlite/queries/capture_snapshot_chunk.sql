-- `outbox capture snapshot`, one chunk (docs/capture.md, "Snapshot"): up to ?2 rows of the
-- captured table after the recorded key (@AFTER@: `key > ?1`, or for the first chunk every
-- row with a key), in key order, each as one outbox event of the trigger's shape with
-- `capture_op = snapshot`. The table is aliased NEW, so the aggregate id, event type and
-- payload are the capture trigger's own expressions (queries/capture_trigger.sql).
--
-- Parameters: ?1 the last key, ?2 the chunk's row limit, ?3 aggregate_type, ?4 the
-- `capture_table` header, ?5 a fixed event type when @EVENT_TYPE@ uses it.
--
-- Order: the chunk runs in a BEGIN IMMEDIATE transaction, which holds SQLite's only write
-- lock from its start to its commit. No writer commits between this read and the commit,
-- so the image read is the row's newest state, every live change of it committed before
-- (with a smaller rowid, hence `seq`) or commits after (with a larger one).
INSERT INTO {{outbox_table}} (aggregate_type, aggregate_id, event_type, payload, headers)
SELECT ?3, CAST(NEW.{{aggregate_id}} AS TEXT), @EVENT_TYPE@, @PAYLOAD@,
       json_object('capture_op', 'snapshot', 'capture_table', ?4)
FROM {{captured_table}} AS "NEW"
WHERE @AFTER@
ORDER BY NEW.{{key_column}}
LIMIT ?2
