-- Takes or renews the relay lease. ?1 = holder, ?2 = now, ?3 = new expiry (Unix
-- microseconds). Succeeds (one row changed) when nobody holds it, when ?1 already holds it
-- (a renewal keeps acquired_at), or when the holder's lease has expired; otherwise changes
-- nothing. Runs in a BEGIN IMMEDIATE transaction, so two relays racing for an expired lease
-- are serialized by SQLite's write lock and exactly one of them wins.
INSERT INTO {{name:_relay_lease}} AS l (id, holder, acquired_at, expires_at)
VALUES (1, ?1, ?2, ?3)
ON CONFLICT (id) DO UPDATE
SET acquired_at = CASE WHEN l.holder = excluded.holder THEN l.acquired_at ELSE excluded.acquired_at END,
    holder = excluded.holder,
    expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at <= excluded.acquired_at
