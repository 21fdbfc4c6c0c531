-- Records that consumer ?1 applied (or passed) position ?4 of aggregate (?2, ?3). Never moves
-- back. Runs in the handler's write transaction.
INSERT INTO {{name:_positions}} (consumer, aggregate_type, aggregate_id, applied_seq)
VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (consumer, aggregate_type, aggregate_id)
DO UPDATE SET applied_seq = max(applied_seq, excluded.applied_seq)
