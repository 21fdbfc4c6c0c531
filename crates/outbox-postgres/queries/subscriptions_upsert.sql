-- Records one [[subscription]] entry: a new row starts in state $4 (active, or paused by
-- `outbox migrate --paused`); an existing row keeps its state and creation time and takes the
-- file's filter and sink. $1 name, $2 filter JSON, $3 sink, $4 state of a new row.
INSERT INTO {{qname:_subscriptions}} AS s (name, filter, sink, state)
VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO UPDATE
SET filter = EXCLUDED.filter, sink = EXCLUDED.sink, updated_at = now()
WHERE (s.filter, s.sink) IS DISTINCT FROM (EXCLUDED.filter, EXCLUDED.sink)
