-- Records that consumer $1 applied (or passed) position $4 of aggregate ($2, $3). Never moves
-- back. In the handler's transaction, it locks the row until commit.
INSERT INTO {{qname:_positions}} AS p (consumer, aggregate_type, aggregate_id, applied_seq)
VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, aggregate_type, aggregate_id)
DO UPDATE SET applied_seq = GREATEST(p.applied_seq, excluded.applied_seq)
