-- CDC: aggregates that have dead letters, read when streaming starts, so that a dead letter
-- keeps holding its aggregate (dead_letter = "hold-aggregate") across restarts and takeovers.
-- Reads *_held_idx (its predicate includes state = 'dead'); usually tiny.
SELECT DISTINCT aggregate_type, aggregate_id FROM {{table}} WHERE state = 'dead'
