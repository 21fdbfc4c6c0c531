-- Records migration ? (version), ? (name), ? (checksum) as applied now.
INSERT INTO {{name:_migrations}} (version, name, checksum) VALUES (?, ?, ?)
