-- Moves the acknowledged position forward, never back (a relay that was paused and lost
-- the stream to another cannot rewind it). ? = file, offset, token, gtid, now, stream, token.
UPDATE {{name:_cdc_position}}
SET binlog_file = ?, binlog_pos = ?, token = ?, gtid = COALESCE(?, gtid), updated_at = ?
WHERE stream = ? AND token < ?
