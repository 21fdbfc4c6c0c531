-- 0008: the relay that owns a CDC slot's saved position (`owner`), so that only it can save.
--
-- A relay that took the slot over writes its own random id here before it reads the saved
-- position (`outbox_cdc_offset_claim.sql`); every save (`outbox_cdc_offset_save.sql`) writes
-- only while the id is still its own. A save of the previous owner that reaches the server
-- late (the COMMIT of a relay killed mid-save, a relay frozen past `wal_sender_timeout` that
-- wakes up) therefore either committed before the takeover read the position, or changes
-- nothing: the new owner never numbers its stream from heads saved past the position it
-- resumed after (docs/ordering.md, "Change streams").
ALTER TABLE {{qname:_cdc_offsets}} ADD COLUMN IF NOT EXISTS owner uuid;
