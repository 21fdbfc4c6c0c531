-- `outbox capture install`: the row trigger of one capture on the business table. AFTER, so
-- it sees the row as written (defaults, BEFORE triggers) and fires only for rows really
-- written. @EVENTS@ is `INSERT`, `UPDATE` or `INSERT OR UPDATE`; @ARGS@ the trigger
-- arguments as quoted literals (see capture_function.sql). {{captured_schema}} and
-- {{captured_table}} name the business table.
CREATE TRIGGER {{name:_outbox_capture}} AFTER @EVENTS@ ON {{captured_schema}}.{{captured_table}}
    FOR EACH ROW EXECUTE FUNCTION {{qname:_outbox_capture}}(@ARGS@)
