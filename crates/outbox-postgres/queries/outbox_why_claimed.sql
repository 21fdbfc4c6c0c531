-- `outbox why`: whether a relay holds the event's row lock right now (its claim
-- transaction: the batch is being published). Run in a transaction that is rolled back at
-- once. FOR KEY SHARE conflicts with the relay's FOR UPDATE, so SKIP LOCKED returns no row
-- exactly when a claim holds it; a relay that tries to claim it during this instant skips
-- it for one poll, nothing more. $1 = id.
SELECT id FROM {{table}} WHERE id = $1 FOR KEY SHARE SKIP LOCKED
