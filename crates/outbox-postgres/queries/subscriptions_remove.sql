-- `outbox subscription remove`: the catalog row only; its table is kept. Primary key.
DELETE FROM {{qname:_subscriptions}} WHERE name = $1
