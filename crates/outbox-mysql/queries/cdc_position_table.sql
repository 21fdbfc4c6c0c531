-- The binlog CDC source's acknowledged position (source.mode = cdc), created by
-- `outbox migrate` in CDC mode. One row per stream: the binlog file and offset just after the
-- last transaction whose every event the broker acknowledged (or that was dead-lettered).
-- After a crash the stream resumes there: nothing is lost, the tail after it is published
-- again (duplicates, never loss). `token` is file number << 32 | offset, which grows with
-- the binlog: a save only ever moves it forward. `gtid` is the server's GTID position at the
-- same point (MariaDB `gtid_binlog_pos` format, one domain-server-seq per domain): on
-- MariaDB the stream resumes by it, which also holds after a failover to a replica.
CREATE TABLE IF NOT EXISTS {{name:_cdc_position}} (
    stream      VARCHAR(64)  CHARACTER SET ascii NOT NULL PRIMARY KEY,
    binlog_file VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL,
    binlog_pos  BIGINT       NOT NULL,
    token       BIGINT       NOT NULL,
    gtid        VARCHAR(2048) CHARACTER SET ascii NULL,
    updated_at  DATETIME(6)  NOT NULL
) ENGINE = InnoDB
