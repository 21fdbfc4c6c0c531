-- `outbox subscription pause|resume`: binds state ('active' or 'paused'), name; primary key.
UPDATE {{name:_subscriptions}} SET state = ?, updated_at = CURRENT_TIMESTAMP(6) WHERE name = ?
