-- 0002: per (consumer, aggregate), the highest delivery position (`aggregate_seq`) applied,
-- written in the same transaction as the side effect (`begin_message` / `process_message`).
-- The consumer loops' order gate reads it to apply an aggregate's events in order across
-- crashes and instances (docs/inbox.md "Order at the consumer").
CREATE TABLE {{qname:_positions}} (
    consumer       text   NOT NULL,
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    applied_seq    bigint NOT NULL,
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
);
