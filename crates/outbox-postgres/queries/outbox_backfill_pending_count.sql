-- `outbox backfill`: how many pending rows each held aggregate has in subscription table
-- {{table}}, locked or not (index *_pending_aggregate_idx). More than the backfill locked
-- means a relay has one in flight. $1 aggregate types, $2 aggregate ids.
SELECT aggregate_type, aggregate_id, count(*)
FROM {{table}}
WHERE state = 'pending'
  AND (aggregate_type, aggregate_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
GROUP BY aggregate_type, aggregate_id
