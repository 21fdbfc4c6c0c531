-- 0001: the outbox table, its indexes, and the relay lease that keeps a second relay on the
-- same file in standby.
--
-- Placeholders are filled by `sql::render` from validated identifiers only:
--   {{table}}         the quoted table name     e.g. "outbox"
--   {{name:_suffix}}  a quoted derived name     e.g. "outbox_pending_seq_idx"
-- SQLite has no schemas (attached databases aside), so there is no schema part.
--
-- Timestamps are INTEGER Unix microseconds (UTC): compact, compared numerically (no text
-- format to agree on between languages), and the relay passes its clock (`now`) as a query
-- parameter so tests can move time. The column defaults below use julianday('now'), which
-- every SQLite since 3.0 has (unixepoch() needs 3.38), because a default is evaluated by
-- whichever SQLite library performs the insert: a Python or Go producer may link an old one.
--
-- No STRICT table (3.37+) for the same reason: an older SQLite refuses to open a file whose
-- schema uses it. The CHECK constraints carry the typing that matters instead.

CREATE TABLE {{table}} (
    -- Written by producers (any language, plain SQL works):
    -- Event id, UUID text (lowercase, hyphenated). The library always binds a UUIDv7. The
    -- default serves plain-SQL producers: also a UUIDv7 (48 bits of Unix milliseconds from
    -- julianday('now'), then random bits with the version and variant set), built from
    -- printf/randomblob because SQLite has no uuid function.
    id               TEXT    NOT NULL DEFAULT (lower(
                         substr(printf('%012x', CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)), 1, 8)
                         || '-' ||
                         substr(printf('%012x', CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)), 9, 4)
                         || '-7' || substr(hex(randomblob(2)), 2, 3)
                         || '-' || substr('89ab', 1 + (random() & 3), 1) || substr(hex(randomblob(2)), 2, 3)
                         || '-' || hex(randomblob(6)))),
    aggregate_type   TEXT    NOT NULL,
    aggregate_id     TEXT    NOT NULL,
    event_type       TEXT    NOT NULL,
    -- The exact bytes delivered as the message body (JSON text, protobuf, ...). A plain-SQL
    -- producer may insert a text literal; the relay reads it back as its UTF-8 bytes.
    payload          BLOB    NOT NULL,
    -- Extra message headers: a JSON object of string values.
    headers          TEXT    NOT NULL DEFAULT '{}',
    -- Insert time. The library binds its own clock (microsecond precision); the default
    -- (millisecond precision) serves plain-SQL producers.
    created_at       INTEGER NOT NULL
                             DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)),

    -- The relay's own bookkeeping:
    -- Commit order. INTEGER PRIMARY KEY makes it the rowid, so the table is stored in seq
    -- order and the claim scan reads it sequentially. SQLite runs one write transaction at a
    -- time per database file (WAL included): a transaction that inserts holds the write lock
    -- from its first write until it commits, so every row it assigns a seq to gets a smaller
    -- seq than any row of a transaction that commits after it, and a reader never sees a row
    -- without every row of smaller seq. seq order is therefore commit order, globally, for
    -- every producer, with no trigger or lock of ours (PostgreSQL needs both).
    -- AUTOINCREMENT: a seq is never reused, even after the newest rows were deleted
    -- (on_delivered = "delete"), so a position identifies one event for the table's life.
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    -- pending -> delivered (or the row is deleted, with on_delivered = "delete") | dead.
    state            TEXT    NOT NULL DEFAULT 'pending',
    -- Failed publish attempts so far; dead-lettered at relay.max_attempts.
    attempts         INTEGER NOT NULL DEFAULT 0,
    -- Not retried before this time (backoff). 0 (the epoch): ready at once.
    next_attempt_at  INTEGER NOT NULL DEFAULT 0,
    -- The latest failure (and, for dead letters, the reason).
    last_error       TEXT,
    delivered_at     INTEGER,
    dead_lettered_at INTEGER,

    CONSTRAINT {{name:_id_key}} UNIQUE (id),
    CONSTRAINT {{name:_id_check}} CHECK (
        id GLOB '????????-????-????-????-????????????' AND NOT id GLOB '*[^0-9a-fA-F-]*'),
    CONSTRAINT {{name:_keys_check}} CHECK (
        aggregate_type <> '' AND aggregate_id <> '' AND event_type <> ''),
    CONSTRAINT {{name:_state_check}} CHECK (state IN ('pending', 'delivered', 'dead')),
    CONSTRAINT {{name:_headers_check}} CHECK (json_valid(headers) AND json_type(headers) = 'object')
);

-- The claim scan: pending events in seq order. Partial, so delivered rows (until retention
-- removes them) and dead letters cost the scan nothing.
CREATE INDEX {{name:_pending_seq_idx}} ON {{table}} (seq) WHERE state = 'pending';

-- "Does a retrying or dead-lettered event hold this aggregate back?" Usually empty, so the
-- per-candidate probe of the claim is one index descent that finds nothing. The claim repeats
-- this predicate word for word so that SQLite's planner may use the partial index.
CREATE INDEX {{name:_held_idx}} ON {{table}} (aggregate_type, aggregate_id, seq)
    WHERE state = 'dead' OR (state = 'pending' AND attempts > 0);

-- Retention and "published in the last minute" (on_delivered = "mark").
CREATE INDEX {{name:_delivered_at_idx}} ON {{table}} (delivered_at) WHERE state = 'delivered';

-- The relay lease. SQLite has no row locks (SKIP LOCKED), so two relays on one file would
-- publish the same events and break per-aggregate order. At most one relay holds this lease
-- and only the holder claims events; another relay on the same file is a standby until the
-- lease expires (its holder died or hung) or is released (its holder stopped). One row.
CREATE TABLE {{name:_relay_lease}} (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    -- Id of the holding relay source: a random UUID and the process id (for humans).
    holder      TEXT    NOT NULL,
    acquired_at INTEGER NOT NULL,
    -- Unix microseconds; after this any relay may take the lease over.
    expires_at  INTEGER NOT NULL
);
