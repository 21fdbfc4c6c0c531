-- `outbox capture snapshot` start: whether a row's primary key is NULL. SQLite allows it in
-- a primary key other than INTEGER PRIMARY KEY (of a rowid table); such a row has no place
-- in key order, so the snapshot is refused instead of skipping it.
SELECT EXISTS (SELECT 1 FROM {{captured_table}} WHERE {{key_column}} IS NULL)
