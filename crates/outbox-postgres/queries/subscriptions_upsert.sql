-- Records one [[subscription]] entry: a new row is active; an existing row keeps its state
-- and creation time and takes the file's filter and sink. $1 name, $2 filter JSON, $3 sink.
INSERT INTO {{qname:_subscriptions}} AS s (name, filter, sink)
VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE
SET filter = EXCLUDED.filter, sink = EXCLUDED.sink, updated_at = now()
WHERE (s.filter, s.sink) IS DISTINCT FROM (EXCLUDED.filter, EXCLUDED.sink)
