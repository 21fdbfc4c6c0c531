-- Where the stream resumes. ? = stream.
SELECT binlog_file, binlog_pos, token, updated_at FROM {{name:_cdc_position}} WHERE stream = ?
