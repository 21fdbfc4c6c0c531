-- Who holds the relay lease, and until when (Unix microseconds). No rows: nobody ever did,
-- or the last holder released it. A plain read: a standby relay polls this without taking
-- SQLite's write lock, so it never delays producers.
SELECT holder, acquired_at, expires_at FROM {{name:_relay_lease}} WHERE id = 1
