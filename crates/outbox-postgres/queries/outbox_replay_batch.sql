-- `outbox replay`, polling mode: puts one batch of selected delivered events back in line
-- (pending, attempts 0, ready at once). They keep their seq, so the running relay publishes
-- them in commit order per aggregate; events of the same aggregate that are pending already
-- interleave with them by seq (docs/operations.md). Same ids: consumers dedupe.
-- $1 = ids (primary key), from outbox_replay_ids.sql; batches go in seq order, so an
-- aggregate's earlier events are back in line before its later ones. A row that changed
-- meanwhile (retention deleted it) is skipped. Returns the ids put back.
UPDATE {{table}}
SET state = 'pending', attempts = 0, next_attempt_at = '-infinity', delivered_at = NULL
WHERE id = ANY($1) AND state = 'delivered'
RETURNING id
