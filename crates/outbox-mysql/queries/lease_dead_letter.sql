-- Dead-letters a leased event, if the lease is still this claim's.
-- ? = reason, ? = now, ? = position, ? = token.
UPDATE {{table}}
SET state = 'dead', attempts = attempts + 1, last_error = ?, dead_lettered_at = ?,
    claimed_by = NULL, claimed_until = NULL
WHERE position = ? AND claimed_by = ? AND state = 'pending'
