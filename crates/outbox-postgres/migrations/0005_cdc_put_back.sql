-- 0005: CDC mode keeps the order of a retried dead letter across relay restarts.
--
-- The publication streams inserts only, so in CDC mode `outbox dead retry` puts a dead letter
-- back in line by deleting and re-inserting it (outbox_cdc_dead_restream.sql). Two things
-- make that order-safe when a relay restarts in between:
--
-- 1. The re-inserted row keeps its `seq`. The relay compares it with the `seq` of the events
--    it streams again from the slot's unconfirmed tail: a later event of the aggregate that
--    was committed before the retry (so it streams first) must not overtake the retried one;
--    the relay streams it again, after it. A producer cannot set `seq`: the trigger keeps a
--    given value only inside a statement that set `outbox.keep_seq` for its transaction
--    (`set_config('outbox.keep_seq', 'on', true)`), as the re-insert does.
-- 2. The re-inserted row is marked: `state = 'pending'`, `attempts = 0` and `last_error` set
--    (a row a producer inserts has no `last_error`; a polling retry has `attempts > 0`).
--    The relay clears `last_error` once the broker has acknowledged it. This index finds the
--    marked rows of an aggregate (and, when a stream starts, every aggregate with one); it is
--    empty nearly always, so producers pay only its predicate check.

CREATE OR REPLACE FUNCTION {{qname:_before_insert}}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(
        TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME || chr(31) || NEW.aggregate_type || chr(31) || NEW.aggregate_id,
        0));
    IF NEW.seq IS NULL OR current_setting('outbox.keep_seq', true) IS DISTINCT FROM 'on' THEN
        NEW.seq := nextval({{regclass:_seq}});
    END IF;
    RETURN NEW;
END
$$;

CREATE INDEX IF NOT EXISTS {{name:_put_back_idx}} ON {{table}} (aggregate_type, aggregate_id, seq)
    WHERE state = 'pending' AND attempts = 0 AND last_error IS NOT NULL;
