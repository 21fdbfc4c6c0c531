-- `outbox subscription pause|resume`: ?1 name, ?2 'active' or 'paused', ?3 now; primary key.
UPDATE {{name:_subscriptions}} SET state = ?2, updated_at = ?3 WHERE name = ?1
