-- `outbox verify`: the delivered events written in the window, in seq (commit) order.
-- ?1 since, ?2 until (created_at, Unix microseconds). Delivered at or after ?1 too (an event
-- is delivered after it was written), so the partial index *_delivered_at_idx bounds the
-- scan to what was delivered since the window began.
SELECT id, aggregate_type, aggregate_id, event_type, seq, created_at, delivered_at
FROM {{table}}
WHERE state = 'delivered'
  AND delivered_at >= ?1
  AND created_at >= ?1
  AND created_at < ?2
ORDER BY seq
