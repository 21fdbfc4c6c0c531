-- The dead letters of one aggregate (index on aggregate_type, aggregate_id, state).
-- ? = aggregate_type, aggregate_id.
SELECT id FROM {{table}}
WHERE aggregate_type = ? AND aggregate_id = ? AND state = 'dead'
ORDER BY seq
