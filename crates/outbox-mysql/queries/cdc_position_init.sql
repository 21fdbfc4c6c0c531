-- Records where the stream starts (the server's binlog position when `migrate` ran in CDC
-- mode) unless a position is kept already. ? = stream, file, offset, token, gtid, now.
INSERT IGNORE INTO {{name:_cdc_position}} (stream, binlog_file, binlog_pos, token, gtid, updated_at)
VALUES (?, ?, ?, ?, ?, ?)
