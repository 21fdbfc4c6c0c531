-- Deletes up to ?2 rows processed before ?1 (Unix microseconds), oldest first (index
-- processed_at_idx), so a large purge holds SQLite's write lock only briefly per batch.
DELETE FROM {{table}}
WHERE (consumer, event_id) IN (
    SELECT consumer, event_id FROM {{table}}
    WHERE processed_at < ?1
    ORDER BY processed_at
    LIMIT ?2
)
