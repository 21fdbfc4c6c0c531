-- `outbox backfill`: removes the held aggregates' pending rows from subscription table
-- {{table}}, to insert them again behind the backfilled events (outbox_backfill_insert.sql),
-- in the same transaction. Deleted rather than renumbered: a relay's claim that started
-- before this commit and reaches such a row after it finds it gone, while an UPDATE would
-- hand it the row with its new seq but not the (to it invisible) older events before it.
-- $1 = ids (locked by outbox_backfill_pending.sql).
DELETE FROM {{table}} WHERE id = ANY($1) AND state = 'pending'
