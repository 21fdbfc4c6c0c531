-- The name of `migrate`'s lock for table ?: per database and table (locks are server-wide),
-- hashed so that it stays within MySQL's 64 characters for lock names whatever the
-- database's name.
SELECT CONCAT('outbox_inbox_migrate.', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', ?)))
