-- Extends the lease inside the settle transaction, only if ?1 still holds it (an expired
-- lease nobody took over is still ours). ?1 = holder, ?2 = new expiry. No row changed: the
-- lease was taken over; the caller then records only the deliveries (facts about the
-- broker) and leaves retries and dead letters to the new holder.
UPDATE {{name:_relay_lease}} SET expires_at = ?2 WHERE id = 1 AND holder = ?1
