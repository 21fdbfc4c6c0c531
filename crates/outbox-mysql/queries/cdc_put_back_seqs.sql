-- CDC mode: one aggregate's rows that were dead letters, were put back to `pending` (`outbox
-- dead retry` keeps their `last_error`; a streamed row is otherwise never written) and have
-- not been delivered since (delivery clears `last_error`, cdc_put_back_delivered.sql).
-- ? = aggregate_type, aggregate_id.
SELECT position, seq FROM {{table}} FORCE INDEX ({{name:_aggregate_idx}})
WHERE aggregate_type = ? AND aggregate_id = ? AND state = 'pending' AND last_error IS NOT NULL
ORDER BY seq
