-- Gives the relay lease up (the relay stopped), so a standby takes over at its next poll
-- instead of waiting for the expiry. ?1 = holder; a lease held by someone else is untouched.
DELETE FROM {{name:_relay_lease}} WHERE id = 1 AND holder = ?1
