-- The subscription catalog of one outbox table (docs/subscriptions.md): the [[subscription]]
-- entries `outbox migrate` recorded. Every relay's fan-out reads it once per claimed batch
-- (a handful of rows, primary-key ordered), so replicas agree whatever file they run.
-- `filter` is the resolved filter as JSON text, compared as text by migrate; `state` is
-- what `outbox subscription pause|resume` sets. DDL commits on its own in MySQL, so this
-- runs before migrate's transaction; IF NOT EXISTS makes concurrent runs harmless.
CREATE TABLE IF NOT EXISTS {{name:_subscriptions}} (
    name       VARCHAR(64)  NOT NULL PRIMARY KEY,
    filter     TEXT         NOT NULL,
    sink       VARCHAR(255) NOT NULL,
    state      VARCHAR(16)  NOT NULL DEFAULT 'active',
    created_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    CONSTRAINT {{name:_subscriptions_state}} CHECK (state IN ('active', 'paused'))
) ENGINE = InnoDB
