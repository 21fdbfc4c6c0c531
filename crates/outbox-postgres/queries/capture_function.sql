-- `outbox capture install` (docs/capture.md): the trigger function of one capture. It runs
-- AFTER each captured write of the business table, in the writer's transaction, and inserts
-- one event into the outbox table. The outbox's own BEFORE INSERT trigger then serializes the
-- writers of the event's aggregate and draws its `seq` (docs/ordering.md): a captured event
-- is ordered, published, or rolled back with its row, exactly like one the application wrote.
--
-- Values arrive as trigger arguments, never in this text:
--   TG_ARGV[0]  the captured table as `schema.table` (the `capture_table` header)
--   TG_ARGV[1]  aggregate_type
--   TG_ARGV[2]  event_type, when it is fixed
-- Placeholders, filled by capture.rs from validated identifiers:
--   {{schema}}.{{outbox_table}}   the outbox table
--   {{qname:_outbox_capture}}     this function, `<capture name>_outbox_capture`, next to it
--   {{aggregate_id}}              a column of the captured table
-- and two expressions capture.rs picks from its own constants: @EVENT_TYPE@ (TG_ARGV[2], or
-- a column cast to text) and @PAYLOAD@ (the row as JSON text, a column's text, or a bytea
-- column), in UTF-8.
CREATE OR REPLACE FUNCTION {{qname:_outbox_capture}}() RETURNS trigger
LANGUAGE plpgsql AS $capture$
DECLARE
    v_aggregate_id text  := NEW.{{aggregate_id}}::text;
    v_event_type   text  := @EVENT_TYPE@;
    v_payload      bytea := @PAYLOAD@;
BEGIN
    -- The outbox's NOT NULL would refuse the row anyway; this says which part is missing.
    IF v_aggregate_id IS NULL OR v_event_type IS NULL OR v_payload IS NULL THEN
        RAISE EXCEPTION 'outbox capture of %: the % of the written row is NULL, so it cannot become an event',
            TG_ARGV[0],
            CASE WHEN v_aggregate_id IS NULL THEN 'aggregate_id column'
                 WHEN v_event_type IS NULL THEN 'event_type column'
                 ELSE 'payload column' END
            USING ERRCODE = 'not_null_violation',
                  HINT = 'give the column a value (or a NOT NULL constraint), or change the [[capture]] entry and run `outbox capture install`';
    END IF;
    INSERT INTO {{schema}}.{{outbox_table}} (aggregate_type, aggregate_id, event_type, payload, headers)
    VALUES (TG_ARGV[1], v_aggregate_id, v_event_type, v_payload,
            jsonb_build_object('capture_op', lower(TG_OP), 'capture_table', TG_ARGV[0]));
    RETURN NULL;
END
$capture$
