-- `outbox capture snapshot`, first statement of a chunk's transaction: the unfinished
-- snapshot of capture $1, locked (by primary key) until the chunk commits. A concurrent run
-- of the same snapshot waits here and then reads the key this chunk recorded: no chunk is
-- written twice. No row: the snapshot finished (in another run).
SELECT last_key::text
FROM {{qname:_capture_snapshots}}
WHERE name = $1 AND finished_at IS NULL
FOR UPDATE
