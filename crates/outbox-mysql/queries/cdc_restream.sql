-- CDC mode: streams rows again, after everything committed before this statement: their
-- state goes to `dead` and back to `pending` in one transaction (two statements, run by the
-- source), and the stream publishes a row put back to `pending`. Used for an event streamed
-- before the dead letters of its aggregate were retried: it must come after them.
-- ? = JSON array of row positions, ? = the state to set (`dead`, then `pending`).
UPDATE JSON_TABLE(?, '$[*]' COLUMNS (p BIGINT PATH '$')) AS r
STRAIGHT_JOIN {{table}} AS o FORCE INDEX (PRIMARY) ON o.position = r.p
SET o.state = ?
