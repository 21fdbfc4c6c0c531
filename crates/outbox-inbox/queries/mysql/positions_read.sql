-- The highest position of aggregate (?, ?) that consumer ? applied (primary key lookup);
-- parameters: consumer, aggregate_type, aggregate_id.
SELECT applied_seq FROM {{name:_positions}}
WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ?
