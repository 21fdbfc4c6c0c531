-- The subscription catalog of one outbox table (docs/subscriptions.md): the [[subscription]]
-- entries `outbox migrate` recorded. Every relay's fan-out reads it once per claimed batch
-- (a handful of rows, primary-key ordered), so relays agree whatever file they run.
-- `filter` is the resolved filter as JSON text, compared as text by migrate; `state` is
-- what `outbox subscription pause|resume` sets; times in Unix microseconds.
CREATE TABLE IF NOT EXISTS {{name:_subscriptions}} (
    name       TEXT    PRIMARY KEY NOT NULL,
    filter     TEXT    NOT NULL,
    sink       TEXT    NOT NULL,
    state      TEXT    NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'paused')),
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
)
