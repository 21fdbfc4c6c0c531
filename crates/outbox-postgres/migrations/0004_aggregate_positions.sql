-- 0004: the highest delivery position handed out per aggregate (the `aggregate_seq` header;
-- docs/inbox.md "Order at the consumer"). Written by the polling relay in the transaction that
-- records a batch's outcomes, read with each claim. One row per aggregate ever published;
-- never deleted, since a consumer compares positions across the aggregate's whole life.
CREATE TABLE IF NOT EXISTS {{qname:_aggregate_positions}} (
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    last_position  bigint NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);
