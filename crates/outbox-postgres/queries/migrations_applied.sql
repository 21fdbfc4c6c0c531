-- The migrations recorded as applied, with their checksums, in version order.
SELECT version, checksum FROM {{qname:_migrations}} ORDER BY version
