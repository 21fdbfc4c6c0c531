-- `outbox capture snapshot` (docs/capture.md, "Snapshot"): one row per capture whose existing
-- rows are being, or were, turned into snapshot events (the columns of PostgreSQL's table).
-- Every chunk's transaction moves `last_key` and `rows` together with the events it inserts,
-- so a killed snapshot resumes after its last committed chunk and never writes a chunk
-- twice. Created by the first snapshot, in its BEGIN IMMEDIATE transaction.
CREATE TABLE IF NOT EXISTS {{name:_capture_snapshots}} (
    name        TEXT    NOT NULL PRIMARY KEY,  -- the capture's name
    table_name  TEXT    NOT NULL,              -- the captured table
    key_column  TEXT    NOT NULL,              -- its primary-key column, which the chunks follow
    -- The last snapshotted row's key, as the key column holds it (no declared type: an
    -- integer stays an integer, a text a text); NULL: none yet.
    last_key,
    "rows"      INTEGER NOT NULL DEFAULT 0,
    -- Unix microseconds, like every timestamp of the outbox.
    started_at  INTEGER NOT NULL,
    finished_at INTEGER                        -- NULL while the snapshot is unfinished
)
