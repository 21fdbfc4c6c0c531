-- The bookkeeping table of the outbox table's migrations (one row per applied migration).
CREATE TABLE IF NOT EXISTS {{qname:_migrations}} (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
