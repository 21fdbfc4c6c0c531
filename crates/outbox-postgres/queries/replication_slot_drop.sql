-- `outbox crash-test`: drops a scratch outbox's replication slot if it exists and no relay
-- streams from it (an active slot cannot be dropped: the caller waits for the server to notice
-- that its killed relay is gone). Returns one row when it dropped the slot.
SELECT pg_drop_replication_slot(slot_name)
FROM pg_replication_slots
WHERE slot_name = $1 AND NOT active
