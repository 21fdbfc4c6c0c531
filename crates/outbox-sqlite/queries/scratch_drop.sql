-- `outbox crash-test`: drops a scratch outbox table and the tables its migrations made beside
-- it (the backend runs it only for a table named `outbox_crash_...`). Indexes go with their
-- table.
DROP TABLE IF EXISTS {{table}};
DROP TABLE IF EXISTS {{name:_relay_lease}};
DROP TABLE IF EXISTS {{name:_aggregate_positions}};
DROP TABLE IF EXISTS {{name:_migrations}};
