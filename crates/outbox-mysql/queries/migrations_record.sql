-- Records one applied migration: version, name, checksum.
INSERT INTO {{name:_migrations}} (version, name, checksum) VALUES (?, ?, ?)
