-- Moves the delivery-position heads of a settled batch's aggregates (outbox_core::aggregate_seq).
-- ?1 = JSON array of [aggregate_type, aggregate_id, head]. Never moves a head back. Runs in the
-- settle write transaction, with the outcomes.
INSERT INTO {{name:_aggregate_positions}} (aggregate_type, aggregate_id, last_position)
SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2 FROM json_each(?1) AS j WHERE true
ON CONFLICT (aggregate_type, aggregate_id)
DO UPDATE SET last_position = max(last_position, excluded.last_position)
