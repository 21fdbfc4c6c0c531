-- Records where the stream starts (the server's binlog position when `migrate` ran in CDC
-- mode) unless a position is kept already. ? = stream, file, offset, token, now.
INSERT IGNORE INTO {{name:_cdc_position}} (stream, binlog_file, binlog_pos, token, updated_at)
VALUES (?, ?, ?, ?, ?)
