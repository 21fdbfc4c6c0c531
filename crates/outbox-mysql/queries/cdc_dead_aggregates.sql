-- Aggregates that have dead letters (read when the stream starts, for hold-aggregate).
SELECT DISTINCT aggregate_type, aggregate_id FROM {{table}} WHERE state = 'dead'
