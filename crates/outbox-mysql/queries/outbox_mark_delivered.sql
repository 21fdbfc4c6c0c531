-- Records acknowledged events as delivered (on_delivered = mark), one statement per batch.
-- The positions drive the join (STRAIGHT_JOIN, primary key): on a small table the optimizer
-- would rather scan it, and a scanning UPDATE waits on rows other replicas have claimed.
-- ? = JSON array of positions, ? = now. The rows are locked by this transaction's claim.
UPDATE JSON_TABLE(?, '$[*]' COLUMNS (p BIGINT PATH '$')) AS d
STRAIGHT_JOIN {{table}} AS o FORCE INDEX (PRIMARY) ON o.position = d.p
SET o.state = 'delivered', o.delivered_at = ?
WHERE o.state = 'pending'
