-- The subscription catalog of one outbox table (docs/subscriptions.md): the [[subscription]]
-- entries `outbox migrate` recorded. Every relay's fan-out reads it once per claimed batch
-- (a handful of rows, primary-key ordered), so replicas agree whatever file they run.
-- `filter` is the resolved filter as JSON text, compared as text by migrate; `state` is
-- what `outbox subscription pause|resume` sets. Created by migrate under an advisory lock.
CREATE TABLE IF NOT EXISTS {{qname:_subscriptions}} (
    name       text        PRIMARY KEY,
    filter     text        NOT NULL,
    sink       text        NOT NULL,
    state      text        NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'paused')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
)
