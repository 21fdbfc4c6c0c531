-- `outbox verify` (polling mode): the delivered events written in the window, in insert
-- order (`seq` orders each aggregate's events). ? = since (delivered_at >=), ? = since,
-- ? = until (created_at). Delivered at or after the window's start too (an event is
-- delivered after it was written), so *_delivered_at_idx bounds the scan.
SELECT id, aggregate_type, aggregate_id, event_type, seq, created_at, delivered_at
FROM {{table}}
WHERE state = 'delivered'
  AND delivered_at >= ?
  AND created_at >= ?
  AND created_at < ?
ORDER BY position
