-- `outbox subscription pause|resume`: $1 name, $2 'active' or 'paused'; primary key.
UPDATE {{qname:_subscriptions}} SET state = $2, updated_at = now() WHERE name = $1
