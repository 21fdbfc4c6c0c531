-- Records that ?1 (consumer) processed event ?2 at ?3 (Unix microseconds), unless it already
-- did. Uses the primary key. Returns one row when inserted, none for a duplicate. Runs in a
-- BEGIN IMMEDIATE transaction, so concurrent deliveries are serialized by SQLite's write lock.
INSERT INTO {{table}} (consumer, event_id, processed_at)
VALUES (?1, ?2, ?3)
ON CONFLICT (consumer, event_id) DO NOTHING
RETURNING 1
