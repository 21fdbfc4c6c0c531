-- The migrations applied so far, in order: version, checksum.
SELECT version, checksum FROM {{name:_migrations}} ORDER BY version
