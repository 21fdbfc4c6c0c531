-- Records acknowledged events as delivered (on_delivered = "mark"). ?1 = JSON array of seqs,
-- ?2 = now (Unix microseconds). One statement for the whole batch, in the settle write
-- transaction; rows are found by primary key (seq is the rowid). `state = 'pending'` makes a
-- repeated settle a no-op and never revives a row an operator changed meanwhile.
UPDATE {{table}}
SET state = 'delivered', delivered_at = ?2, next_attempt_at = 0
WHERE seq IN (SELECT value FROM json_each(?1)) AND state = 'pending'
