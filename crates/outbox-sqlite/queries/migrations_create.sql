-- The bookkeeping table of the outbox table's migrations (one row per applied migration).
CREATE TABLE IF NOT EXISTS {{name:_migrations}} (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    checksum   TEXT    NOT NULL,
    -- Unix microseconds, like every timestamp of the outbox.
    applied_at INTEGER NOT NULL
)
