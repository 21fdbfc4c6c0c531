-- `outbox verify`: events written from ? to ? (created_at) that are not delivered: pending
-- or retrying (CDC mode: not yet known to be streamed), and dead-lettered.
SELECT CAST(COALESCE(SUM(state = 'pending'), 0) AS SIGNED),
       CAST(COALESCE(SUM(state = 'dead'), 0) AS SIGNED)
FROM {{table}}
WHERE state <> 'delivered'
  AND created_at >= ?
  AND created_at < ?
