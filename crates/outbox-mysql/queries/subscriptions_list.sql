-- Every catalogued subscription (the fan-out's routes, status, `subscription list`); a
-- handful of rows in primary key order, read once per claimed batch.
SELECT name, filter, sink, state, created_at FROM {{name:_subscriptions}} ORDER BY name
