-- The bookkeeping table of the outbox table's migrations (one row per applied migration).
CREATE TABLE IF NOT EXISTS {{name:_migrations}} (
    version    INT          NOT NULL PRIMARY KEY,
    name       VARCHAR(100) NOT NULL,
    checksum   VARCHAR(32)  NOT NULL,
    applied_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE = InnoDB
