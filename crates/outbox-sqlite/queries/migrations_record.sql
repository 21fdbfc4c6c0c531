-- Records one applied migration: version, name, checksum; applied_at in Unix
-- microseconds, computed as the outbox table's column defaults compute it.
INSERT INTO {{name:_migrations}} (version, name, checksum, applied_at)
VALUES (?1, ?2, ?3, CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER))
