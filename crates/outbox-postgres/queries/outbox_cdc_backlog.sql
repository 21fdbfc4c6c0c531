-- CDC backlog counter kept in the table: dead letters (through *_held_idx). Pending events
-- live in the WAL, not in row state: see replication_slot_status.sql.
SELECT count(*) FROM {{table}} WHERE state = 'dead'
