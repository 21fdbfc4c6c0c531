-- Records one [[subscription]] entry: a new row starts in the given state (active, or paused
-- by `outbox migrate --paused`); an existing row keeps its state and creation time and takes
-- the file's filter and sink. Binds: name, filter JSON, sink, state of a new row.
INSERT INTO {{name:_subscriptions}} (name, filter, sink, state)
VALUES (?, ?, ?, ?)
ON DUPLICATE KEY UPDATE filter = VALUES(filter), sink = VALUES(sink), updated_at = CURRENT_TIMESTAMP(6)
