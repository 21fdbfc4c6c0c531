-- 0001: the outbox table, the per-aggregate head rows, and the trigger that numbers each
-- aggregate's events in commit order for every producer (docs/mysql.md).
--
-- Statements are separated by lines holding only `-- ;;` (a trigger body has semicolons of
-- its own). Placeholders come from validated identifiers only and render backquoted:
--   {{table}}  the outbox table          {{name:_suffix}}  a derived name
-- No double quotes in this file: they would be string literals in MySQL.

CREATE TABLE IF NOT EXISTS {{table}} (
    -- The relay's claim order (insert order; per-aggregate order comes from `seq`).
    position         BIGINT       NOT NULL AUTO_INCREMENT,
    -- Written by producers (any language, plain SQL works); the trigger fills id and headers
    -- when they are left out.
    id               CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NULL,
    aggregate_type   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    aggregate_id     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    event_type       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- The exact bytes delivered as the message body.
    payload          LONGBLOB     NOT NULL,
    -- Extra message headers: a JSON object of string values.
    headers          LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    created_at       DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),

    -- The relay's own bookkeeping (the same names and meanings as on PostgreSQL):
    -- Per-aggregate position, 1, 2, 3, ... in commit order (set by the trigger).
    seq              BIGINT       NOT NULL DEFAULT 0,
    state            VARCHAR(16)  CHARACTER SET ascii NOT NULL DEFAULT 'pending',
    attempts         INT          NOT NULL DEFAULT 0,
    next_attempt_at  DATETIME(6)  NOT NULL DEFAULT '1970-01-01 00:00:01',
    last_error       TEXT         CHARACTER SET utf8mb4 NULL,
    delivered_at     DATETIME(6)  NULL,
    dead_lettered_at DATETIME(6)  NULL,
    -- The lease-token claim (source.claim = lease, for servers without SKIP LOCKED): which
    -- claim holds the row, until when. Unused by the SKIP LOCKED claim.
    claimed_by       CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NULL,
    claimed_until    DATETIME(6)  NULL,

    PRIMARY KEY (position),
    UNIQUE KEY {{name:_id_key}} (id),
    KEY {{name:_pending_idx}} (state, position),
    -- An aggregate's events by state, in order: the relay's probes read one entry (the
    -- aggregate's first pending or dead event, with its next attempt time) from the index
    -- alone, however many events the aggregate has.
    KEY {{name:_aggregate_idx}} (aggregate_type, aggregate_id, state, seq, next_attempt_at),
    KEY {{name:_claimed_idx}} (claimed_by),
    -- Throughput for status and metrics, and retention's oldest-first deletes.
    KEY {{name:_delivered_at_idx}} (delivered_at),
    CONSTRAINT {{name:_state_check}} CHECK (state IN ('pending', 'delivered', 'dead')),
    CONSTRAINT {{name:_headers_check}} CHECK (JSON_VALID(headers) AND JSON_TYPE(headers) = 'OBJECT')
) ENGINE = InnoDB
-- ;;
-- The highest position handed out per aggregate. The trigger's upsert locks the aggregate's
-- row until the producer's transaction ends: a second transaction writing for the same
-- aggregate waits there, so positions follow commit order, with no gaps (a rollback takes
-- its position back with it).
CREATE TABLE IF NOT EXISTS {{name:_aggregate_heads}} (
    aggregate_type VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    aggregate_id   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    last_seq       BIGINT NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
) ENGINE = InnoDB
-- ;;
DROP TRIGGER IF EXISTS {{name:_before_insert}}
-- ;;
CREATE TRIGGER {{name:_before_insert}} BEFORE INSERT ON {{table}} FOR EACH ROW
BEGIN
    DECLARE r CHAR(32);
    IF NEW.id IS NULL THEN
        -- UUIDv7: 48 bits of Unix milliseconds, version 7, variant 10, random bits.
        SET r = LOWER(HEX(RANDOM_BYTES(16)));
        SET NEW.id = CONCAT(
            LPAD(LOWER(HEX(FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000))), 12, '0'),
            '7', SUBSTR(r, 1, 3),
            ELT(1 + CONV(SUBSTR(r, 4, 1), 16, 10) % 4, '8', '9', 'a', 'b'), SUBSTR(r, 5, 3),
            SUBSTR(r, 8, 12));
        SET NEW.id = CONCAT(SUBSTR(NEW.id, 1, 8), '-', SUBSTR(NEW.id, 9, 4), '-',
            SUBSTR(NEW.id, 13, 4), '-', SUBSTR(NEW.id, 17, 4), '-', SUBSTR(NEW.id, 21, 12));
    END IF;
    IF NEW.headers IS NULL THEN
        SET NEW.headers = '{}';
    END IF;
    INSERT INTO {{name:_aggregate_heads}} (aggregate_type, aggregate_id, last_seq)
        VALUES (NEW.aggregate_type, NEW.aggregate_id, 1)
        ON DUPLICATE KEY UPDATE last_seq = last_seq + 1;
    -- This transaction's own write: visible to it whatever its snapshot.
    SET NEW.seq = (SELECT last_seq FROM {{name:_aggregate_heads}}
        WHERE aggregate_type = NEW.aggregate_type AND aggregate_id = NEW.aggregate_id);
END
