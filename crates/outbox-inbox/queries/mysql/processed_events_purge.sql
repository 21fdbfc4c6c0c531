-- Deletes up to ? (second parameter) rows processed before ? (first parameter, UTC), oldest
-- first through the processed_at index, so a large purge runs as short statements that never
-- hold many row locks at once.
DELETE FROM {{table}}
WHERE processed_at < ?
ORDER BY processed_at
LIMIT ?
