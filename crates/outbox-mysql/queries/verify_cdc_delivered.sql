-- `outbox verify` (CDC mode): rows stay 'pending' once streamed; the caller passes an `until`
-- that the kept binlog position has passed (see src/verify.rs). ? = since, ? = until
-- (created_at).
SELECT id, aggregate_type, aggregate_id, event_type, seq, created_at, NULL
FROM {{table}}
WHERE state = 'pending'
  AND created_at >= ?
  AND created_at < ?
ORDER BY position
