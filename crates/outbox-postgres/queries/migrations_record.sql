-- Records one applied migration: version, name, checksum.
INSERT INTO {{qname:_migrations}} (version, name, checksum) VALUES ($1, $2, $3)
