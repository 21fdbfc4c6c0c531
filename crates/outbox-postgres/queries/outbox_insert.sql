-- Writes one event in the caller's transaction. The insert trigger takes the aggregate's lock
-- and assigns seq. $1 id, $2 aggregate_type, $3 aggregate_id, $4 event_type, $5 payload,
-- $6 headers.
INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers)
VALUES ($1, $2, $3, $4, $5, $6)
