-- Where the stream resumes. ? = stream.
SELECT binlog_file, binlog_pos, token, updated_at, gtid FROM {{name:_cdc_position}} WHERE stream = ?
