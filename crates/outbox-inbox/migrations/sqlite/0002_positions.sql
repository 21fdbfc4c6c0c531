-- 0002: per (consumer, aggregate), the highest delivery position (`aggregate_seq`) applied,
-- written in the same transaction as the side effect (`begin_message` / `process_message`).
-- The consumer loops' order gate reads it (docs/inbox.md "Order at the consumer").
CREATE TABLE {{name:_positions}} (
    consumer       TEXT    NOT NULL,
    aggregate_type TEXT    NOT NULL,
    aggregate_id   TEXT    NOT NULL,
    applied_seq    INTEGER NOT NULL,
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
) WITHOUT ROWID;
