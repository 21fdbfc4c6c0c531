-- Producer transactions waiting for an aggregate's ordering lock, and the transaction that
-- holds it (pid, age, query start): a long producer transaction delays later producers of
-- the same aggregate, never the relay. $1 = max rows.
SELECT w.pid AS waiting_pid,
       b.pid AS holder_pid,
       extract(epoch FROM clock_timestamp() - b.xact_start)::float8 AS holder_xact_age,
       b.state AS holder_state,
       left(b.query, 200) AS holder_query
FROM pg_locks AS w
JOIN pg_stat_activity AS wa ON wa.pid = w.pid
CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS bp (pid)
JOIN pg_stat_activity AS b ON b.pid = bp.pid
WHERE w.locktype = 'advisory' AND NOT w.granted AND wa.datname = current_database()
ORDER BY b.xact_start
LIMIT $1
