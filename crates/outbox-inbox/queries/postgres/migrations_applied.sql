-- The migrations applied so far, in order: version, checksum.
SELECT version, checksum FROM {{qname:_migrations}} ORDER BY version
