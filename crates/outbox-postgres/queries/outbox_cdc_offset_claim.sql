-- Makes relay $2 (a random id per stream session) the owner of slot $1's saved position,
-- right after it took the slot and before it reads the position (migration 0008). Waits for
-- a save of the previous owner that is still running (it holds the row), so that save is
-- either in what the new owner reads next, or refused afterwards. A slot never saved gets
-- its row now (position 0, no snapshot: what no row means).
INSERT INTO {{qname:_cdc_offsets}} AS o (slot, confirmed_lsn, updated_at, owner)
VALUES ($1, 0, now(), $2)
ON CONFLICT (slot) DO UPDATE SET owner = excluded.owner
