-- `outbox capture install` (docs/capture.md): the trigger of one capture for one kind of
-- write (SQLite fires a trigger for INSERT or for UPDATE, not both). AFTER, so it sees the
-- row as written (defaults, REPLACE). It runs inside the writer's statement and transaction:
-- the event commits or rolls back with the row.
--
-- The event gets what a plain-SQL producer's row gets: `id` from the column default (a
-- UUIDv7 built in SQL, migrations/0001), `created_at` from its default, and `seq` from the
-- rowid, which follows commit order because SQLite runs one write transaction at a time.
--
-- Filled by capture.rs in three steps: first its own constant SQL (the trigger's name as a
-- derived-name placeholder, INSERT or UPDATE, the NULL checks, the event_type and payload
-- expressions); then the validated identifiers (the captured and outbox tables, columns),
-- quoted; last, in one pass that is never scanned again, the literals made by
-- Dialect::Sqlite.literal (aggregate type, op, table, messages) and the row payload.
CREATE TRIGGER @TRIGGER@ AFTER @EVENT@ ON {{captured_table}} FOR EACH ROW
BEGIN
@CHECKS@    INSERT INTO {{outbox_table}} (aggregate_type, aggregate_id, event_type, payload, headers)
    VALUES (@AGGREGATE_TYPE@, CAST(NEW.{{aggregate_id}} AS TEXT), @EVENT_TYPE@, @PAYLOAD@,
            json_object('capture_op', @OP@, 'capture_table', @CAPTURE_TABLE@));
END
