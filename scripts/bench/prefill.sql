-- Prefills the backlog: :rows pending events in one INSERT ... SELECT, 1,000 distinct
-- aggregates (round robin, so consecutive events belong to different aggregates), ~200-byte
-- JSON payloads. Goes through the table's insert trigger (per-aggregate lock + seq) like any
-- producer. Then VACUUM ANALYZE and CHECKPOINT, so every scenario starts from the same state:
-- planner statistics that know the backlog, hint bits set, no checkpoint debt.
-- Usage: psql -v rows=100000 [-v analyze=false] -f prefill.sql
-- analyze=false skips the VACUUM ANALYZE (the table then has no statistics yet, as a
-- freshly migrated table that receives a backlog before autovacuum has looked at it).
\set ON_ERROR_STOP on
\if :{?analyze}
\else
\set analyze true
\endif
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'Order',
       'o_' || (g % 1000),
       'order.placed',
       convert_to(format('{"order_id":"o_%s","n":%s,"pad":"%s"}', g % 1000, g, repeat('x', 160)), 'UTF8')
FROM generate_series(1, :rows) AS g;
\if :analyze
VACUUM ANALYZE outbox;
\endif
CHECKPOINT;
