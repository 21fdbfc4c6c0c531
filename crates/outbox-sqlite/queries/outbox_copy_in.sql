-- Copies one relayed event into a subscription's table (`[[subscription]]` fan-out), keeping
-- its id, payload, headers and creation time. ?1 id (UUID text), ?2 aggregate_type,
-- ?3 aggregate_id, ?4 event_type, ?5 payload (blob), ?6 headers (JSON object text),
-- ?7 created_at (Unix microseconds). An id already present is left alone, so copying a batch
-- again after a crash adds nothing; seq (the rowid) follows the copy order.
INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
ON CONFLICT DO NOTHING
