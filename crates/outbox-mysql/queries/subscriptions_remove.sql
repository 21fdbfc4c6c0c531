-- `outbox subscription remove`: the catalog row only; its table is kept. Primary key.
DELETE FROM {{name:_subscriptions}} WHERE name = ?
