-- `outbox verify` (CDC mode): the streamed rows written in the window whose transaction the
-- slot has confirmed, in seq order. In CDC mode rows stay 'pending' (the stream, not the row,
-- carries the event); a row is delivered once its inserting transaction is older than the
-- horizon $3 of retention_cdc_horizon.sql and the slot's confirmed_flush_lsn passed that
-- observation's WAL position (the same argument as CDC retention, retention_cdc_*.sql).
-- $1 since, $2 until (created_at), $3 the horizon xid (32-bit, as text).
SELECT id, aggregate_type, aggregate_id, event_type, seq, created_at
FROM {{table}}
WHERE state = 'pending'
  AND created_at >= $1
  AND created_at < $2
  AND age(xmin) > age($3::text::xid)
ORDER BY seq
