-- Removes acknowledged events (on_delivered = "delete"): nothing for retention to clean up,
-- no history for replay. ?1 = JSON array of seqs. Rows found by primary key (seq is the rowid).
DELETE FROM {{table}}
WHERE seq IN (SELECT value FROM json_each(?1)) AND state = 'pending'
