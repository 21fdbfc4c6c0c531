-- CDC mode: put-back dead letters the broker acknowledged: no longer waited for
-- (cdc_put_back_seqs.sql). ? = JSON array of row positions.
UPDATE JSON_TABLE(?, '$[*]' COLUMNS (p BIGINT PATH '$')) AS r
STRAIGHT_JOIN {{table}} AS o FORCE INDEX (PRIMARY) ON o.position = r.p
SET o.last_error = NULL
WHERE o.state = 'pending'
