-- Takes `migrate`'s named lock ? (from migrate_lock_name.sql), waiting up to ? seconds: 1 when
-- taken, 0 on timeout. Held by the session until migrate_unlock.sql (or the session's end).
SELECT GET_LOCK(?, ?)
