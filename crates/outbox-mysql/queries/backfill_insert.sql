-- `outbox backfill`: inserts the backfilled events and the re-inserted pending rows of the
-- held aggregates into subscription table {{table}}, in row order, which is outbox commit
-- order per aggregate: the insert trigger numbers each row from the aggregate's head in
-- insert order, so the pipeline delivers and numbers them in that order. A re-inserted row
-- keeps its id, attempts, backoff and last error. The caller appends one
-- `(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)` per row (id, aggregate type, aggregate id, event type,
-- payload, headers, created_at, attempts, next_attempt_at, last_error): a multi-row VALUES,
-- not INSERT ... SELECT, whose table-level AUTO-INC lock (a bulk insert of unknown size)
-- failed against the fan-out's concurrent copies with error 1467 (the capture snapshot met
-- the same AUTO-INC deadlock, docs/capture.md).
INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers,
                       created_at, attempts, next_attempt_at, last_error)
VALUES
