-- Records acknowledged events as delivered (on_delivered = "mark"). $1 = seqs, $2 = now.
-- One statement for the whole batch; rows are found through *_pending_seq_idx. The rows are
-- locked by this transaction's claim, so no other replica can have changed them.
UPDATE {{table}}
SET state = 'delivered', delivered_at = $2, next_attempt_at = '-infinity'
WHERE seq = ANY($1) AND state = 'pending'
