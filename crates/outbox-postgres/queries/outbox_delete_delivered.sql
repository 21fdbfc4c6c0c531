-- Removes acknowledged events (on_delivered = "delete"): about half the WAL of marking them,
-- and nothing for retention to clean up. $1 = seqs. Rows found through *_pending_seq_idx.
DELETE FROM {{table}}
WHERE seq = ANY($1) AND state = 'pending'
