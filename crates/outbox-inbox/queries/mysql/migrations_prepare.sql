-- Run by `migrate` before reading the bookkeeping (raw SQL, under migrate's named lock): the
-- bookkeeping table `<table>_migrations`, next to the inbox table in the connection's
-- database.
CREATE TABLE IF NOT EXISTS {{name:_migrations}} (
    version    INT          NOT NULL PRIMARY KEY,
    name       VARCHAR(100) NOT NULL,
    checksum   VARCHAR(64)  NOT NULL,
    applied_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE = InnoDB
