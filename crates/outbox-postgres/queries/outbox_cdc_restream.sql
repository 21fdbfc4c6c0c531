-- CDC: streams rows again, after everything committed so far, by deleting and re-inserting
-- them unchanged (every column, `seq` too: run in a transaction that set `outbox.keep_seq`,
-- migration 0005). For events of an aggregate that the slot's unconfirmed tail streamed
-- ahead of a retried dead letter they followed: they must come after it. $1 = ids.
WITH gone AS (
    DELETE FROM {{table}} WHERE id = ANY($1) AND state = 'pending'
    RETURNING *
)
INSERT INTO {{table}}
SELECT * FROM gone ORDER BY seq
RETURNING id
