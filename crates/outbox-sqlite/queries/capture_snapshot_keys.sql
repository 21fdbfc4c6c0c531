-- `outbox capture snapshot` start: the captured table's primary-key columns (?1), in key
-- order (capture_snapshot_null_key.sql then asks for NULL keys). A table without a declared
-- primary key (only a rowid) has none.
SELECT name FROM pragma_table_info(?1) WHERE pk > 0 ORDER BY pk
