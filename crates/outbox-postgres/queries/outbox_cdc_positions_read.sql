-- CDC: the delivery-position heads of aggregates the stream brought (outbox_core::aggregate_seq,
-- "Change streams"); an aggregate without a row has none yet (0). Read with the slot held, so
-- they are the heads saved with the acknowledged position the stream resumed after.
-- $1 = aggregate types, $2 = aggregate ids (parallel arrays).
SELECT h.aggregate_type, h.aggregate_id, h.last_position
FROM {{qname:_aggregate_positions}} AS h
JOIN unnest($1::text[], $2::text[]) AS k (aggregate_type, aggregate_id)
  ON h.aggregate_type = k.aggregate_type AND h.aggregate_id = k.aggregate_id
