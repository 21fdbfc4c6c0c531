-- 0001: the outbox table, its indexes, the UUIDv7 default, and the trigger that makes
-- per-aggregate order hold for every producer (docs/ordering.md).
--
-- Placeholders are filled by `sql::render` from validated identifiers only:
--   {{schema}}         the quoted schema               e.g. "public"
--   {{table}}          the quoted, qualified table     e.g. "public"."outbox"
--   {{name:_suffix}}   an unqualified derived name     e.g. "outbox_pending_seq_idx"
--   {{qname:_suffix}}  a qualified derived name        e.g. "public"."outbox_seq"
--   {{regclass:_suffix}} a derived name as a regclass literal for nextval()

CREATE SCHEMA IF NOT EXISTS {{schema}};

-- UUIDv7 (RFC 9562) for producers that do not bring their own id: 48 bits of Unix
-- milliseconds, then random bits, with the version (7) and variant bits set. PostgreSQL 15
-- has no built-in uuidv7(). Time-ordered ids keep the primary-key index append-mostly.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

-- Commit-order position of each event within its aggregate. Assigned by the trigger below,
-- after the aggregate's lock is taken, never by the producer.
CREATE SEQUENCE {{qname:_seq}} AS bigint;

CREATE TABLE {{table}} (
    -- Written by producers (any language, plain SQL works):
    id               uuid        NOT NULL DEFAULT {{schema}}.outbox_uuid_v7(),
    aggregate_type   text        NOT NULL,
    aggregate_id     text        NOT NULL,
    event_type       text        NOT NULL,
    -- The exact bytes delivered as the message body (JSON text, protobuf, ...).
    payload          bytea       NOT NULL,
    -- Extra message headers: a JSON object of string values.
    headers          jsonb       NOT NULL DEFAULT '{}',
    -- clock_timestamp(), not now(): the time of the insert, not of the transaction start.
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),

    -- The relay's own bookkeeping:
    -- Per-aggregate commit order (see the trigger). Producers need not (and cannot) set it.
    seq              bigint      NOT NULL,
    -- pending -> delivered (or the row is deleted, with on_delivered = "delete") | dead.
    state            text        NOT NULL DEFAULT 'pending',
    -- Failed publish attempts so far; dead-lettered at relay.max_attempts.
    attempts         integer     NOT NULL DEFAULT 0,
    -- Not retried before this time (backoff). -infinity: ready at once.
    next_attempt_at  timestamptz NOT NULL DEFAULT '-infinity',
    -- The latest failure (and, for dead letters, the reason).
    last_error       text,
    delivered_at     timestamptz,
    dead_lettered_at timestamptz,

    CONSTRAINT {{name:_pkey}} PRIMARY KEY (id),
    CONSTRAINT {{name:_state_check}} CHECK (state IN ('pending', 'delivered', 'dead')),
    CONSTRAINT {{name:_headers_check}} CHECK (jsonb_typeof(headers) = 'object')
);

COMMENT ON TABLE {{table}} IS
    'Transactional outbox: events written in the same transaction as the business data, published by `outbox relay`.';

-- The claim scan: pending events in seq order. Partial, so delivered rows (until retention
-- removes them) and dead letters cost the scan nothing. Also used to settle by seq.
CREATE INDEX {{name:_pending_seq_idx}} ON {{table}} (seq) WHERE state = 'pending';

-- "Which earlier events of this aggregate are still pending?" (the claim's gap check).
CREATE INDEX {{name:_pending_aggregate_idx}} ON {{table}} (aggregate_type, aggregate_id, seq)
    WHERE state = 'pending';

-- "Does a retrying or dead-lettered event hold this aggregate back?" Usually empty, so the
-- per-candidate probe of the claim is one index descent that finds nothing.
CREATE INDEX {{name:_held_idx}} ON {{table}} (aggregate_type, aggregate_id, seq)
    WHERE state = 'dead' OR (state = 'pending' AND attempts > 0);

-- Retention and "published in the last minute" (on_delivered = "mark").
CREATE INDEX {{name:_delivered_at_idx}} ON {{table}} (delivered_at) WHERE state = 'delivered';

-- Per-aggregate writer serialization. Every insert first takes a transaction-scoped advisory
-- lock on its aggregate, then draws `seq`. A second transaction writing the same aggregate
-- waits at its insert until the first commits or rolls back, so within an aggregate, seq order
-- is commit order, and a row is never visible before an earlier row of its aggregate. This
-- holds for every producer, including plain SQL INSERTs from other languages. The lock key
-- hashes schema, table and aggregate; a hash collision only serializes two aggregates.
CREATE FUNCTION {{qname:_before_insert}}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(
        TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME || chr(31) || NEW.aggregate_type || chr(31) || NEW.aggregate_id,
        0));
    NEW.seq := nextval({{regclass:_seq}});
    RETURN NEW;
END
$$;

CREATE TRIGGER {{name:_order}} BEFORE INSERT ON {{table}}
    FOR EACH ROW EXECUTE FUNCTION {{qname:_before_insert}}();

-- Optional wake-up for relays with listen_notify = true. Only the function is created here;
-- `outbox migrate` creates or drops the statement-level trigger according to the config,
-- because a NOTIFY in every producer transaction serializes commits (docs/polling.md).
CREATE FUNCTION {{qname:_notify}}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_NAME || '_wakeup', '');
    RETURN NULL;
END
$$;
