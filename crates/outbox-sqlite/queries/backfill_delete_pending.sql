-- `outbox backfill`: takes the held aggregates' pending rows that must follow a backfilled
-- event out of subscription table {{table}}, to insert them again behind it
-- (backfill_insert.sql) in the same transaction: the new rows get new, higher seqs, which is
-- the order the pipeline reads. ?1 = JSON array of ids.
DELETE FROM {{table}} WHERE id IN (SELECT value FROM json_each(?1)) AND state = 'pending'
