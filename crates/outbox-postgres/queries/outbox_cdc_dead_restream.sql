-- CDC mode: puts dead letters back in line by deleting and re-inserting them, because the
-- publication streams inserts only (an UPDATE back to 'pending' would never be seen).
-- Every dead row of each chosen aggregate is re-inserted, in its original seq order, so the
-- events that were parked behind a dead letter ("held: ...") follow it in order. The insert
-- trigger assigns new seq values (commit order again). Same ids: consumers still dedupe.
-- $1 = ids or NULL, $2 = event_type or NULL, $3 = all dead letters.
WITH chosen AS (
    SELECT DISTINCT aggregate_type, aggregate_id
    FROM {{table}}
    WHERE state = 'dead' AND ($3 OR id = ANY($1) OR event_type = $2)
),
gone AS (
    DELETE FROM {{table}} AS o
    USING chosen AS c
    WHERE o.state = 'dead'
      AND o.aggregate_type = c.aggregate_type
      AND o.aggregate_id = c.aggregate_id
    RETURNING o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers,
              o.created_at, o.seq
)
INSERT INTO {{table}} (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at)
SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at
FROM gone
ORDER BY seq
RETURNING id
