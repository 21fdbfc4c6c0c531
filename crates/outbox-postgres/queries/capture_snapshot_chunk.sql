-- `outbox capture snapshot`, one chunk (docs/capture.md, "Snapshot"): up to $1 rows of the
-- captured table after the recorded key ($4, the last key as JSON text; NULL: from the
-- start), in key order, each as one outbox event of the trigger's shape with
-- `capture_op = snapshot`.
--
-- Parameters: $1 the chunk's row limit, $2 aggregate_type, $3 the `capture_table` header,
-- $4 the last key (jsonb text or NULL), $5 the key column's name, and $6 a fixed event type
-- when @EVENT_TYPE@ uses it.
--
-- The primary-key index serves the range and the order: the key bound is a stable
-- expression of the parameters (the JSON key turned back into the column's type by the
-- table's own row type), planned per execution (the statement is never prepared for reuse,
-- so `$4 IS NULL` folds away).
--
-- Locking: FOR SHARE keeps every read row from being updated until this chunk commits, and
-- waits for a writer holding one. A writer's change therefore either committed before the
-- row was read (READ COMMITTED re-reads the newest version after the wait: the image below
-- includes it, and its own event was inserted before this one) or waits for this chunk's
-- commit (its event comes after the snapshot event). The INSERT fires the outbox's BEFORE
-- INSERT trigger, which takes each aggregate's advisory lock and draws `seq`, as for any
-- producer: per aggregate, `seq` order is commit order.
WITH chunk AS (
    SELECT t.{{key_column}} AS snapshot_key,
           t.{{aggregate_id}}::text AS aggregate_id,
           @EVENT_TYPE@ AS event_type,
           @PAYLOAD@ AS payload
    FROM {{captured_schema}}.{{captured_table}} AS t
    WHERE $4::text IS NULL
       OR t.{{key_column}} > (pg_catalog.jsonb_populate_record(
              NULL::{{captured_schema}}.{{captured_table}},
              pg_catalog.jsonb_build_object($5::text, $4::text::jsonb))).{{key_column}}
    ORDER BY t.{{key_column}}
    LIMIT $1
    FOR SHARE OF t
), events AS (
    INSERT INTO {{schema}}.{{outbox_table}} (aggregate_type, aggregate_id, event_type, payload, headers)
    SELECT $2, aggregate_id, event_type, payload,
           pg_catalog.jsonb_build_object('capture_op', 'snapshot', 'capture_table', $3::text)
    FROM chunk
    ORDER BY snapshot_key
    RETURNING 1
)
SELECT (SELECT count(*) FROM events) AS rows,
       (SELECT pg_catalog.to_jsonb(snapshot_key)::text FROM chunk
        ORDER BY snapshot_key DESC LIMIT 1) AS last_key
