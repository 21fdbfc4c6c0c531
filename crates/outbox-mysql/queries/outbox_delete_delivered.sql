-- Deletes acknowledged events (on_delivered = delete), one statement per batch.
-- The positions drive the join (STRAIGHT_JOIN, primary key): on a small table the optimizer
-- would rather scan it, and a scanning UPDATE waits on rows other replicas have claimed.
-- ? = JSON array of positions. The rows are locked by this transaction's claim.
DELETE o
FROM JSON_TABLE(?, '$[*]' COLUMNS (p BIGINT PATH '$')) AS d
STRAIGHT_JOIN {{table}} AS o FORCE INDEX (PRIMARY) ON o.position = d.p
WHERE o.state = 'pending'
