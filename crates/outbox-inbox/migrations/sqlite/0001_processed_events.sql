-- 0001: the inbox table. One row per (consumer, event) that a consumer has processed,
-- written in the same transaction as the consumer's side effect, so the row exists exactly
-- when the side effect does.
--
-- Placeholders are filled by `sql::render` from validated identifiers only:
--   {{table}}         the quoted table               e.g. "processed_events"
--   {{name:_suffix}}  a derived name                 e.g. "processed_events_processed_at_idx"

CREATE TABLE {{table}} (
    -- Who processed the event; several consumers may each process the same event once.
    consumer     TEXT    NOT NULL,
    -- The event id (lower-case hyphenated UUID text, as in the message's `id` header).
    event_id     TEXT    NOT NULL,
    -- Unix microseconds (UTC), like every timestamp of the SQLite outbox; retention deletes
    -- by it. The clock is a parameter of the insert.
    processed_at INTEGER NOT NULL,
    -- The unique key that makes a duplicate delivery insert nothing (ON CONFLICT DO NOTHING).
    PRIMARY KEY (consumer, event_id)
) WITHOUT ROWID;

-- Retention (`purge_older_than`) deletes the oldest rows first.
CREATE INDEX {{name:_processed_at_idx}} ON {{table}} (processed_at);
