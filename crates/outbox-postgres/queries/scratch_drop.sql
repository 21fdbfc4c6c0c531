-- `outbox crash-test`: drops a scratch outbox table and everything its migrations made for it
-- (the backend runs it only for a table named `outbox_crash_...`). The sequence is not owned
-- by the table, so it goes by name; `outbox_uuid_v7()` is shared by every outbox table of the
-- schema and stays. Each statement tolerates what is already gone.
DROP TABLE IF EXISTS {{table}};
DROP TABLE IF EXISTS {{qname:_migrations}};
DROP TABLE IF EXISTS {{qname:_cdc_offsets}};
DROP TABLE IF EXISTS {{qname:_aggregate_positions}};
DROP SEQUENCE IF EXISTS {{qname:_seq}};
DROP FUNCTION IF EXISTS {{qname:_before_insert}}();
DROP FUNCTION IF EXISTS {{qname:_notify}}();
