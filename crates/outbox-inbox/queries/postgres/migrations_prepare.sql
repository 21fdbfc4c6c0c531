-- Run by `migrate` before reading the bookkeeping (raw SQL, in migrate's transaction, after
-- its advisory lock): the schema, then the bookkeeping table `<table>_migrations` next to the
-- inbox table.
CREATE SCHEMA IF NOT EXISTS {{schema}};

CREATE TABLE IF NOT EXISTS {{qname:_migrations}} (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
