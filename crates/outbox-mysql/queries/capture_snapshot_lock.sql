-- `outbox capture snapshot`, first statement of a chunk's transaction: the unfinished
-- snapshot of capture ?, locked (by primary key) until the chunk commits. A concurrent run
-- of the same snapshot waits here and then reads the key this chunk recorded: no chunk is
-- written twice. No row: the snapshot finished (in another run).
SELECT last_key
FROM {{name:_capture_snapshots}}
WHERE name = ? AND finished_at IS NULL
FOR UPDATE
