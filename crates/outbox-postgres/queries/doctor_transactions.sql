-- Transactions of this database that are open now, oldest first, for `outbox doctor`,
-- `outbox why`, `outbox status` and the relay's watchdog: who holds the xmin horizon
-- (vacuum cannot remove dead rows any transaction may still see) and who holds an
-- aggregate's ordering lock. The caller's own session is left out, and so are the relay's
-- claim transactions (application_name = 'outbox'), which are bounded by
-- source.claim_timeout. $1 = minimum transaction age in seconds, $2 = max rows.
-- pg_stat_activity is an in-memory view: cheap.
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
FROM pg_stat_activity AS a
WHERE a.datname = current_database()
  AND a.pid <> pg_backend_pid()
  AND a.xact_start IS NOT NULL
  AND a.backend_type = 'client backend'
  AND a.application_name <> 'outbox'
  AND clock_timestamp() - a.xact_start >= make_interval(secs => $1)
ORDER BY a.xact_start
LIMIT $2
