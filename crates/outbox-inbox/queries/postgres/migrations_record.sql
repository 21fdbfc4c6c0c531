-- Records migration $1 (version), $2 (name), $3 (checksum) as applied now.
INSERT INTO {{qname:_migrations}} (version, name, checksum) VALUES ($1, $2, $3)
