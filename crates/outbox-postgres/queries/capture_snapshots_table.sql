-- `outbox capture snapshot` (docs/capture.md, "Snapshot"): one row per capture whose existing
-- rows are being, or were, turned into snapshot events. Every chunk's transaction moves
-- `last_key` and `rows` together with the events it inserts, so a killed snapshot resumes
-- after its last committed chunk and never writes a chunk twice. Created by the first
-- snapshot, under the capture commands' advisory lock (so two first runs do not race).
CREATE TABLE IF NOT EXISTS {{qname:_capture_snapshots}} (
    name        text        PRIMARY KEY,   -- the capture's name
    table_name  text        NOT NULL,      -- the captured table, `schema.table`
    key_column  text        NOT NULL,      -- its primary-key column, which the chunks follow
    last_key    jsonb,                     -- the last snapshotted row's key (to_jsonb); NULL: none yet
    rows        bigint      NOT NULL DEFAULT 0,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz                -- NULL while the snapshot is unfinished
)
