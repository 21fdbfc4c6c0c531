-- `outbox capture snapshot` (docs/capture.md, section Snapshot): one row per capture whose existing
-- rows are being, or were, turned into snapshot events (the columns of PostgreSQL's table).
-- Every chunk's transaction moves `last_key` and `rows` together with the events it inserts,
-- so a killed snapshot resumes after its last committed chunk and never writes a chunk
-- twice. Created by the first snapshot.
CREATE TABLE IF NOT EXISTS {{name:_capture_snapshots}} (
    name        VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,  -- the capture's name
    table_name  VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    key_column  VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- The last snapshotted row's key as text: an integer in decimal, a string as it is, a
    -- binary key in hex; NULL: none yet.
    last_key    LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    `rows`      BIGINT       NOT NULL DEFAULT 0,
    started_at  DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    finished_at DATETIME(6)  NULL,  -- NULL while the snapshot is unfinished
    PRIMARY KEY (name)
) ENGINE = InnoDB
