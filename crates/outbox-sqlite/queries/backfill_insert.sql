-- `outbox backfill`: inserts one backfilled event or re-inserted pending row into
-- subscription table {{table}}; called in outbox commit order per aggregate, so seq (the
-- rowid, drawn at insert) is that order. A re-inserted row keeps its id, attempts, backoff
-- and last error. ?1 id, ?2 aggregate_type, ?3 aggregate_id, ?4 event_type, ?5 payload,
-- ?6 headers (JSON object text), ?7 created_at, ?8 attempts, ?9 next_attempt_at (Unix
-- microseconds; 0: ready at once), ?10 last_error.
INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers,
                       created_at, attempts, next_attempt_at, last_error)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
