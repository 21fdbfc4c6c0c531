-- Records one [[subscription]] entry: a new row is active; an existing row keeps its state
-- and creation time and takes the file's filter and sink. Binds: name, filter JSON, sink.
INSERT INTO {{name:_subscriptions}} (name, filter, sink)
VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE filter = VALUES(filter), sink = VALUES(sink), updated_at = CURRENT_TIMESTAMP(6)
