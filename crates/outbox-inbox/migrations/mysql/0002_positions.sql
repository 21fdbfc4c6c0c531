-- 0002: per (consumer, aggregate), the highest delivery position (`aggregate_seq`) applied,
-- written in the same transaction as the side effect (`begin_message` / `process_message`).
-- The consumer loops' order gate reads it to apply an aggregate's events in order across
-- crashes and instances (docs/inbox.md, section Order at the consumer).
--
-- One idempotent statement (MySQL commits DDL on its own). The types of aggregate_type and
-- aggregate_id are those of the MySQL outbox table. The key is 3 × 1020 bytes, within
-- InnoDB's 3072-byte limit (DYNAMIC rows, the default since MySQL 5.7 and MariaDB 10.2).
CREATE TABLE IF NOT EXISTS {{name:_positions}} (
    consumer       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    aggregate_type VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    aggregate_id   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    applied_seq    BIGINT       NOT NULL,
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
) ENGINE = InnoDB
