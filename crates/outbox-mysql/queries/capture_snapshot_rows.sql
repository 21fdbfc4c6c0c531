-- `outbox capture snapshot`, second statement of a chunk's transaction (docs/capture.md,
-- section Snapshot): the next ? rows after the recorded key (@AFTER@: `key > ?` with the key
-- bound first, or TRUE for the first chunk), in key order, share-locked until the chunk
-- commits, each as its key in text (@KEY_TEXT@) and its event's aggregate id, event type and
-- payload bytes. The table is aliased NEW, so these are the capture trigger's own
-- expressions (queries/capture_trigger.sql), the literals spliced in last as there.
--
-- The lock is what orders the snapshot against live writes: a writer of one of these rows
-- waits for the chunk's commit before its capture trigger inserts its event, and a writer
-- holding one made this read wait for its commit (a locking read then returns the newest
-- version, READ COMMITTED or not), its event inserted before.
SELECT @KEY_TEXT@, CAST(NEW.{{aggregate_id}} AS CHAR), @EVENT_TYPE@, CAST(@PAYLOAD@ AS BINARY)
FROM {{captured_table}} AS `NEW`
WHERE @AFTER@
ORDER BY NEW.{{key_column}}
LIMIT ?
LOCK IN SHARE MODE
