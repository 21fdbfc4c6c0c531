-- Records one failed attempt of a leased event, if the lease is still this claim's.
-- ? = next attempt, ? = error, ? = position, ? = token.
UPDATE {{table}}
SET attempts = attempts + 1, next_attempt_at = ?, last_error = ?,
    claimed_by = NULL, claimed_until = NULL
WHERE position = ? AND claimed_by = ? AND state = 'pending'
