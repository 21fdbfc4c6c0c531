-- `outbox verify` (polling mode): events written in the window and not delivered: pending
-- or retrying, and dead-lettered. $1 since, $2 until (created_at).
SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'dead')
FROM {{table}}
WHERE state <> 'delivered'
  AND created_at >= $1
  AND created_at < $2
