-- CDC: the aggregate locks of outbox_cdc_aggregate_lock.sql, for the aggregates that
-- `outbox dead retry` chooses (same selection as outbox_cdc_dead_restream.sql, which runs
-- next, in the same transaction, with a snapshot taken after the locks).
-- $1 = ids or NULL, $2 = event_type or NULL, $3 = all dead letters.
SELECT pg_advisory_xact_lock(hashtextextended(
           '{{table}}' || chr(31) || 'dead' || chr(31) || a.t || chr(31) || a.i, 0))
FROM (SELECT DISTINCT aggregate_type AS t, aggregate_id AS i
      FROM {{table}}
      WHERE state = 'dead' AND ($3 OR id = ANY($1) OR event_type = $2)
      ORDER BY 1, 2) AS a
