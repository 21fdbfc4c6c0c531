-- Every catalogued subscription (the fan-out's routes, status, `subscription list`); a
-- handful of rows read by primary key order, once per claimed batch.
SELECT name, filter, sink, state, created_at FROM {{qname:_subscriptions}} ORDER BY name
