-- Records that a consumer applied (or passed) a position of an aggregate. Parameters:
-- consumer, aggregate_type, aggregate_id, seq, and seq again for the update. Never moves
-- back. In the handler's transaction, it locks the row (primary key) until commit.
-- `GREATEST(applied_seq, ?)` rather than `VALUES(applied_seq)` (deprecated in MySQL 8) or a
-- row alias (MySQL 8 only, not MariaDB).
INSERT INTO {{name:_positions}} (consumer, aggregate_type, aggregate_id, applied_seq)
VALUES (?, ?, ?, ?)
ON DUPLICATE KEY UPDATE applied_seq = GREATEST(applied_seq, ?)
