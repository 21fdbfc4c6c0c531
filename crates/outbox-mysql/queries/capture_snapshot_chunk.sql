-- `outbox capture snapshot`, third statement of a chunk's transaction (docs/capture.md,
-- section Snapshot): the rows after the recorded key (@AFTER@ as in capture_snapshot_keys.sql) up
-- to the last key the keys statement locked (bound last, as @KEY_BOUND@ reads it), in key
-- order, each as one outbox event of the trigger's shape with `capture_op = snapshot`. The
-- table is aliased NEW: the aggregate id, event type and payload are the capture trigger's
-- own expressions (queries/capture_trigger.sql), the literals spliced in last as there.
--
-- Locking read again (LOCK IN SHARE MODE): the pool's sessions run READ COMMITTED, which
-- takes no gap locks, so a row inserted into the range since the keys statement is read,
-- and locked, here too (its insert event committed before this one).
--
-- Order: the outbox's BEFORE INSERT trigger draws each event's `seq` from its aggregate's
-- head row, locked until this transaction ends (migrations/0001), as for every producer.
-- A writer of a read row either committed before the read (its event holds a smaller
-- `seq`) or waits for this commit before its trigger takes the head row (a larger one).
INSERT INTO {{outbox_table}} (aggregate_type, aggregate_id, event_type, payload, headers)
SELECT @AGGREGATE_TYPE@, CAST(NEW.{{aggregate_id}} AS CHAR), @EVENT_TYPE@, @PAYLOAD@,
       JSON_OBJECT('capture_op', 'snapshot', 'capture_table', @CAPTURE_TABLE@)
FROM {{captured_table}} AS `NEW`
WHERE @AFTER@ AND NEW.{{key_column}} <= @KEY_BOUND@
ORDER BY NEW.{{key_column}}
LOCK IN SHARE MODE
