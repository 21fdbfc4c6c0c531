-- `outbox backfill`, in the chunk's BEGIN IMMEDIATE transaction: takes the relay lease of
-- subscription table {{table}} for the backfill, whoever holds it (the lease is the
-- subscription pipeline's claim: while the backfill holds it no relay reads the table; a
-- relay that held it stands by at its next fetch and records only deliveries at its next
-- settle, as after any takeover). The caller read the previous holder's expiry first and
-- treats the rows that holder may have read as in flight until then.
-- ?1 = holder, ?2 = now, ?3 = expiry (Unix microseconds).
INSERT INTO {{name:_relay_lease}} AS l (id, holder, acquired_at, expires_at)
VALUES (1, ?1, ?2, ?3)
ON CONFLICT (id) DO UPDATE
SET acquired_at = CASE WHEN l.holder = excluded.holder THEN l.acquired_at ELSE excluded.acquired_at END,
    holder = excluded.holder,
    expires_at = excluded.expires_at
