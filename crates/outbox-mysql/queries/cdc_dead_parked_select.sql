-- CDC mode: the events parked as dead letters behind the chosen ones (dead_letter =
-- hold-aggregate parks an aggregate's later events, reason `held: ...`): `outbox dead retry`
-- puts them back with the chosen ones, so the stream publishes the aggregate in order.
-- ? = JSON array of the chosen rows' positions.
SELECT o.position, o.id
FROM {{table}} AS o
WHERE o.state = 'dead' AND o.last_error LIKE 'held:%'
  AND (o.aggregate_type, o.aggregate_id) IN (
      SELECT c.aggregate_type, c.aggregate_id FROM {{table}} AS c
      WHERE JSON_CONTAINS(?, CONCAT(c.position)))
  AND NOT JSON_CONTAINS(?, CONCAT(o.position))
ORDER BY o.position
FOR UPDATE
