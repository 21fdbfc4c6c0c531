-- `outbox capture install` (docs/capture.md): the trigger of one capture for one kind of
-- write (a MySQL trigger fires for INSERT or for UPDATE), in the outbox's database, which
-- holds the captured table too. AFTER, so it sees the row as written. It runs inside the writer's statement and
-- transaction: the event commits or rolls back with the row.
--
-- The event is written with `id`, `seq` and `created_at` left to the outbox table's own BEFORE INSERT
-- trigger, exactly as for any producer: it draws a UUIDv7 and the aggregate's next `seq`
-- from the aggregate's head row, whose lock serializes the writers of one aggregate until
-- commit (migrations/0001). A captured event is numbered in commit order like any other.
--
-- Filled by capture.rs in three steps: first its own constant SQL (the trigger's name, the
-- write, the NULL checks, the event_type and payload expressions); then the validated
-- identifiers, backquoted; last, in one pass that is never scanned again, the literals of
-- Dialect::MySql (aggregate type, op, table, messages) and the row payload.
CREATE TRIGGER @TRIGGER@ AFTER @EVENT@ ON {{captured_table}} FOR EACH ROW
BEGIN
@CHECKS@    INSERT INTO {{outbox_table}} (aggregate_type, aggregate_id, event_type, payload, headers)
    VALUES (@AGGREGATE_TYPE@, CAST(NEW.{{aggregate_id}} AS CHAR), @EVENT_TYPE@, @PAYLOAD@,
            JSON_OBJECT('capture_op', @OP@, 'capture_table', @CAPTURE_TABLE@));
END
