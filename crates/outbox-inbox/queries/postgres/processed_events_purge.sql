-- Deletes up to $2 rows processed before $1, oldest first (index processed_at_idx), so a
-- large purge runs as short transactions that never hold many row locks at once.
DELETE FROM {{table}}
WHERE ctid IN (
    SELECT ctid FROM {{table}}
    WHERE processed_at < $1
    ORDER BY processed_at
    LIMIT $2
)
