-- `outbox verify` (CDC mode): rows written in the window whose transaction the slot has not
-- confirmed yet (not older than the horizon $3), and dead-lettered rows. $1 since, $2 until.
SELECT count(*) FILTER (WHERE state = 'pending' AND NOT age(xmin) > age($3::text::xid)),
       count(*) FILTER (WHERE state = 'dead')
FROM {{table}}
WHERE created_at >= $1
  AND created_at < $2
