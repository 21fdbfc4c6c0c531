-- CDC: one aggregate's rows put back in line by `outbox dead retry` and not delivered since
-- (see migration 0005), with the seq they kept. Reads *_put_back_idx.
-- $1 aggregate_type, $2 aggregate_id.
SELECT id, seq FROM {{table}}
WHERE aggregate_type = $1 AND aggregate_id = $2
  AND state = 'pending' AND attempts = 0 AND last_error IS NOT NULL
ORDER BY seq
