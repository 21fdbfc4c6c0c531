-- Moves the delivery-position heads of a settled batch's aggregates (outbox_core::aggregate_seq).
-- $1 = aggregate types, $2 = aggregate ids, $3 = new heads (parallel arrays, sorted by key so
-- two writers lock rows in the same order). Never moves a head back.
INSERT INTO {{qname:_aggregate_positions}} AS h (aggregate_type, aggregate_id, last_position)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
ON CONFLICT (aggregate_type, aggregate_id)
DO UPDATE SET last_position = GREATEST(h.last_position, excluded.last_position)
