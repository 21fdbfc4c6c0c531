-- Records migration ?1 (version), ?2 (name), ?3 (checksum) as applied now (Unix
-- microseconds, as the outbox computes them).
INSERT INTO {{name:_migrations}} (version, name, checksum, applied_at)
VALUES (?1, ?2, ?3, CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER))
