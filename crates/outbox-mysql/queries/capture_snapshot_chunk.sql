-- `outbox capture snapshot`, third statement of a chunk's transaction: the events of the
-- rows the second statement read (capture_snapshot_rows.sql), one `VALUES` tuple per row, in
-- key order (capture.rs repeats the tuple; its `?` are the aggregate id, event type and
-- payload of each row).
--
-- A multi-row INSERT ... VALUES and not an INSERT ... SELECT: InnoDB holds its table-level
-- AUTO-INC lock to the end of an INSERT ... SELECT (innodb_autoinc_lock_mode 1, MariaDB's
-- default), and a writer whose capture trigger already holds an aggregate's head row would
-- then wait for that lock while this statement waits for the head row: a deadlock, reported
-- to the application as error 1467. A VALUES list of known length takes the lock only to
-- draw its numbers.
--
-- Order: the outbox's BEFORE INSERT trigger draws each event's `seq` from its aggregate's
-- head row, locked until this transaction ends (migrations/0001), as for every producer.
INSERT INTO {{outbox_table}} (aggregate_type, aggregate_id, event_type, payload, headers)
VALUES (@AGGREGATE_TYPE@, ?, ?, ?, JSON_OBJECT('capture_op', 'snapshot', 'capture_table', @CAPTURE_TABLE@))
