-- Records that ? (consumer) processed event ? (hyphenated UUID text) at ? (UTC), unless it
-- already did. Uses the primary key (consumer, event_id). A duplicate fails with ER_DUP_ENTRY
-- (1062), which `MySqlInbox::record` turns into `false`: InnoDB undoes only the failed
-- statement and the transaction stays usable. A concurrent transaction inserting the same key
-- waits here until the other ends: if it committed, this is a duplicate; if it rolled back,
-- this inserts.
--
-- Not INSERT IGNORE: it also turns other errors into warnings (a consumer name over 255
-- characters would be cut to one that may belong to another consumer). Not ON DUPLICATE KEY
-- UPDATE with a no-op update: sqlx connects with CLIENT_FOUND_ROWS, under which that counts
-- one affected row for a duplicate, as for an insert.
INSERT INTO {{table}} (consumer, event_id, processed_at)
VALUES (?, ?, ?)
