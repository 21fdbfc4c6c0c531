-- Writes one event in the caller's transaction. ?1 id (UUID text), ?2 aggregate_type,
-- ?3 aggregate_id, ?4 event_type, ?5 payload (blob), ?6 headers (JSON object text),
-- ?7 created_at (Unix microseconds). seq is assigned by SQLite (the rowid); it follows commit
-- order because SQLite serializes write transactions (see the migration).
INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
