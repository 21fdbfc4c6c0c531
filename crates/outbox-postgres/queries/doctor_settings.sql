-- Server settings that decide whether CDC can work and whether a forgotten replication
-- slot can fill the disk. max_slot_wal_keep_size is in MB; -1 means unlimited.
SELECT current_setting('wal_level')                          AS wal_level,
       current_setting('max_slot_wal_keep_size')             AS max_slot_wal_keep_size,
       current_setting('max_replication_slots')::int         AS max_replication_slots,
       current_setting('server_version_num')::int            AS server_version_num
