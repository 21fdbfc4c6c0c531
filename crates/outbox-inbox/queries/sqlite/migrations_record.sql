-- Records migration ?1 (version), ?2 (name), ?3 (checksum) as applied at ?4 (Unix
-- microseconds).
INSERT INTO {{name:_migrations}} (version, name, checksum, applied_at) VALUES (?1, ?2, ?3, ?4)
