INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers)
VALUES (?, ?, ?, ?, ?, ?)
