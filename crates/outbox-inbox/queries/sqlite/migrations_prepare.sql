-- Run by `migrate` before reading the bookkeeping (raw SQL, in migrate's BEGIN IMMEDIATE
-- transaction): the bookkeeping table `<table>_migrations`.
CREATE TABLE IF NOT EXISTS {{name:_migrations}} (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    checksum   TEXT    NOT NULL,
    applied_at INTEGER NOT NULL
)
