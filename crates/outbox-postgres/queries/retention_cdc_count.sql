-- Retention dry run (CDC mode): rows created before the cutoff $1 whose inserting
-- transaction is older than the horizon $2 (see retention_cdc_delete_batch.sql).
SELECT count(*), min(created_at)
FROM {{table}}
WHERE state = 'pending' AND created_at < $1 AND age(xmin) > age($2::text::xid)
