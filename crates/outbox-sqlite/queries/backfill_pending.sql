-- `outbox backfill`, under the hold: the pending rows of the chunk's aggregates in
-- subscription table {{table}}, in seq (delivery) order, with the seq of each event in
-- outbox table {{outbox}} (NULL when retention removed the outbox row). next_attempt_at is
-- NULL for 0 (ready at once). ?1 = JSON array of [aggregate_type, aggregate_id].
SELECT s.id, s.aggregate_type, s.aggregate_id, s.event_type,
       CAST(s.payload AS BLOB) AS payload, s.headers, s.created_at, s.attempts,
       NULLIF(s.next_attempt_at, 0) AS next_attempt_at, s.last_error, o.seq AS outbox_seq
FROM {{table}} AS s
LEFT JOIN {{outbox}} AS o ON o.id = s.id
WHERE s.state = 'pending'
  AND (s.aggregate_type, s.aggregate_id) IN (
      SELECT j.value ->> 0, j.value ->> 1 FROM json_each(?1) AS j)
ORDER BY s.seq
