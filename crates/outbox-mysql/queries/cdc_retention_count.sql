-- CDC mode: how many streamed rows a retention run would delete (created before ?), and the
-- oldest creation time among them. See cdc_retention_delete_batch.sql.
SELECT COUNT(*), MIN(created_at)
FROM {{table}}
WHERE state = 'pending' AND created_at < ?
