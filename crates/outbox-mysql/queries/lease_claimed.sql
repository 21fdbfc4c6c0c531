-- The rows one lease-token claim took (index *_claimed_idx). ? = token.
SELECT o.position, o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload,
       o.headers, o.created_at, o.attempts, o.seq
FROM {{table}} AS o
WHERE o.claimed_by = ? AND o.state = 'pending'
ORDER BY o.position
