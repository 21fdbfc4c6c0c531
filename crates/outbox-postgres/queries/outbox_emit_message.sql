-- Writes one table-less event into the WAL in the caller's transaction (CDC mode only).
-- $1 = message prefix (source.message_prefix), $2 = the encoded event (docs/cdc.md).
-- transactional = true: the message is decoded only if, and when, the transaction commits, in
-- commit order with the outbox rows around it. No table, no index, nothing to clean up.
SELECT pg_logical_emit_message(true, $1, $2)
