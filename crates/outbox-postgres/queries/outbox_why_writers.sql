-- `outbox why` for an id that is not (yet) visible: transactions that have written to the
-- outbox table and not committed. Every INSERT takes RowExclusiveLock on the table until
-- its transaction ends, so these are exactly the in-progress writers; an event one of them
-- wrote becomes visible, and publishable, when it commits. The relay's own sessions
-- (application_name = 'outbox') and the caller are left out. $1 = the table as a
-- qualified, quoted name (text, resolved by to_regclass), $2 = max rows.
-- Same columns as doctor_transactions.sql.
SELECT a.pid,
       a.usename::text,
       a.application_name,
       a.state,
       extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS xact_age_seconds,
       a.xact_start,
       a.query_start,
       left(a.query, 200)                                            AS query,
       (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)     AS pins_xmin,
       age(coalesce(a.backend_xid, a.backend_xmin))::bigint          AS xmin_age_xids
FROM pg_locks AS l
JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'relation'
  AND l.relation = to_regclass($1)
  AND l.mode = 'RowExclusiveLock'
  AND l.granted
  AND a.pid <> pg_backend_pid()
  AND a.application_name <> 'outbox'
ORDER BY a.xact_start
LIMIT $2
