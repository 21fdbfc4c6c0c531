-- CDC mode: the stream never writes to a row, so streamed rows stay `pending`. Deletes up to
-- ? (second parameter) of them created before ? (first parameter): the caller passes a cutoff
-- at or before both `now - keep` and `keep` before the last time the acknowledged position
-- moved (see docs/mysql.md, CDC: retention). Dead letters are kept until purged.
DELETE FROM {{table}}
WHERE state = 'pending' AND created_at < ?
ORDER BY position
LIMIT ?
