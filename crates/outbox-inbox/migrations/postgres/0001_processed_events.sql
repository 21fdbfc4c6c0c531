-- 0001: the inbox table. One row per (consumer, event) that a consumer has processed,
-- written in the same transaction as the consumer's side effect, so the row exists exactly
-- when the side effect does.
--
-- Placeholders are filled by `sql::render` from validated identifiers only:
--   {{schema}}        the quoted schema              e.g. "public"
--   {{table}}         the quoted, qualified table    e.g. "public"."processed_events"
--   {{name:_suffix}}  an unqualified derived name    e.g. "processed_events_processed_at_idx"

CREATE SCHEMA IF NOT EXISTS {{schema}};

CREATE TABLE {{table}} (
    -- Who processed the event. Several consumers (services, or handlers of one service) may
    -- each process the same event once, so the consumer is part of the key.
    consumer     text        NOT NULL,
    -- The event id from the message's `id` header: the deduplication key.
    event_id     uuid        NOT NULL,
    -- When it was processed (the clock is a parameter of the insert); retention deletes by it.
    processed_at timestamptz NOT NULL,
    -- The unique key that makes a duplicate delivery insert nothing (ON CONFLICT DO NOTHING).
    -- A second transaction inserting the same key waits for the first to end, then inserts
    -- nothing if the first committed, so concurrent duplicates run the side effect once.
    PRIMARY KEY (consumer, event_id)
);

-- Retention (`purge_older_than`) deletes the oldest rows first; without this index every
-- purge would scan the whole table.
CREATE INDEX {{name:_processed_at_idx}} ON {{table}} (processed_at);
