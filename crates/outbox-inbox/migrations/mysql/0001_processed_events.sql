-- 0001: the inbox table. One row per (consumer, event) that a consumer has processed,
-- written in the same transaction as the consumer's side effect, so the row exists exactly
-- when the side effect does.
--
-- MySQL commits DDL on its own, so this file is one idempotent statement (IF NOT EXISTS,
-- the index declared inside the table): a `migrate` cut off before its bookkeeping row is
-- finished by the next one. Placeholders come from validated identifiers only and render
-- backquoted:
--   {{table}}         the table (in the connection's database)  e.g. `processed_events`
--   {{name:_suffix}}  a derived name                            e.g. `processed_events_processed_at_idx`
-- No double quotes in this file: they would be string literals in MySQL.

CREATE TABLE IF NOT EXISTS {{table}} (
    -- Who processed the event. Several consumers may each process the same event once, so
    -- the consumer is part of the key. Binary collation: names compare byte for byte, as on
    -- PostgreSQL. Up to 255 characters (a longer name is refused in strict mode).
    consumer     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- The event id from the message's `id` header, lower-case hyphenated UUID text (the
    -- text the outbox table's `id` column holds): the deduplication key.
    event_id     CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- When it was processed (UTC; the clock is a parameter of the insert); retention deletes
    -- by it.
    processed_at DATETIME(6)  NOT NULL,
    -- The unique key that makes a duplicate delivery insert nothing (ER_DUP_ENTRY). A second
    -- transaction inserting the same key waits for the first to end, then fails as a
    -- duplicate if the first committed, or inserts if it rolled back: concurrent duplicates
    -- run the side effect once.
    PRIMARY KEY (consumer, event_id),
    -- Retention (`purge_older_than`) deletes the oldest rows first; without this index every
    -- purge would scan the whole table.
    KEY {{name:_processed_at_idx}} (processed_at)
) ENGINE = InnoDB
