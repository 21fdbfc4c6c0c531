-- `outbox capture install` (docs/capture.md): what is installed. MySQL triggers carry no
-- comment, so each capture writing into this outbox table is recorded here, one row per
-- capture name: the captured table (`schema.table`) and the [[capture]] entry as JSON
-- (`record`, the same record PostgreSQL keeps as its function's comment). Created by the
-- first install, next to the outbox table; `list` reads it with information_schema.TRIGGERS.
CREATE TABLE IF NOT EXISTS {{name:_capture}} (
    name         VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    table_name   VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    record       LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    installed_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (name)
) ENGINE = InnoDB
