-- Records that $1 (consumer) processed event $2 at $3, unless it already did.
-- Uses the primary key (consumer, event_id). Returns one row when inserted, none for a
-- duplicate. A concurrent transaction inserting the same key blocks here until the other
-- ends: if it committed, this inserts nothing (duplicate); if it rolled back, this inserts.
INSERT INTO {{table}} (consumer, event_id, processed_at)
VALUES ($1, $2, $3)
ON CONFLICT (consumer, event_id) DO NOTHING
RETURNING 1
