-- `outbox verify`: events written in the window and not delivered: (pending or retrying,
-- dead-lettered). ?1 since, ?2 until (created_at, Unix microseconds).
SELECT coalesce(sum(state = 'pending'), 0), coalesce(sum(state = 'dead'), 0)
FROM {{table}}
WHERE state <> 'delivered'
  AND created_at >= ?1
  AND created_at < ?2
