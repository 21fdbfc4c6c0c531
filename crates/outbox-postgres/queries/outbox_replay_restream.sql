-- `outbox replay`, CDC mode: the publication streams inserts only, so a replayed event is
-- deleted and re-inserted (same id, payload, headers and created_at), in seq order, which
-- the insert trigger turns into new seq values in that same order: per-aggregate order is
-- kept, and the stream carries the events again when this statement commits. Same ids:
-- consumers dedupe. $1 = ids (primary key) of one batch, from outbox_replay_ids.sql; batches
-- go in the original seq order. Returns the ids re-inserted.
WITH gone AS (
    DELETE FROM {{table}}
    WHERE id = ANY($1) AND state = 'pending'
    RETURNING id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, seq
)
INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at)
SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at
FROM gone
ORDER BY seq
RETURNING id
