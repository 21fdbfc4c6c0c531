-- `outbox capture install` (docs/capture.md): what is installed. SQLite triggers carry no
-- comment, so each capture writing into this outbox table is recorded here, one row per
-- capture name: the captured table and the [[capture]] entry as JSON (`record`, the same
-- record PostgreSQL keeps as its function's comment). Created by the first install, in its
-- transaction; `list` reads it with the triggers in sqlite_schema.
CREATE TABLE IF NOT EXISTS {{name:_capture}} (
    name         TEXT    NOT NULL PRIMARY KEY,
    table_name   TEXT    NOT NULL,
    record       TEXT    NOT NULL,
    -- Unix microseconds, like every timestamp of the outbox.
    installed_at INTEGER NOT NULL
)
