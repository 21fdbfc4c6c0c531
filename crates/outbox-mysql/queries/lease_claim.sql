-- The lease-token claim (source.claim = lease): for servers without SKIP LOCKED or
-- JSON_TABLE. Marks the next batch as held by one claim token until a server time.
-- ? = now, ? = now, ? = 1 when a dead letter holds its aggregate, ? = limit, ? = token,
-- ? = lease length in microseconds.
--
-- The candidates are chosen by a plain read in a derived table (MySQL refuses a subquery on
-- the table an UPDATE changes unless it is materialized like this): pending, ready, not held
-- by a live lease, and the aggregate's first pending event is not an earlier one waiting for
-- its next attempt, nor its first dead event an earlier one under hold-aggregate (the same
-- index-only probes as outbox_claim_batch.sql). The UPDATE then locks each candidate by primary key (the
-- candidates drive the join: scanning the table would wait on producers' new rows) and checks
-- again that it is still pending and free, so two relays never both take a row. A deadlock
-- with a concurrent settle is run again by the relay.
UPDATE (
    SELECT c.position
    FROM (
        SELECT p.position
        FROM {{table}} AS p FORCE INDEX ({{name:_pending_idx}})
        WHERE p.state = 'pending'
          AND (p.claimed_until IS NULL OR p.claimed_until < NOW(6))
          AND p.next_attempt_at <= ?
          AND NOT COALESCE((
              SELECT h.seq < p.seq AND h.next_attempt_at > ?
              FROM {{table}} AS h FORCE INDEX ({{name:_aggregate_idx}})
              WHERE h.aggregate_type = p.aggregate_type
                AND h.aggregate_id = p.aggregate_id
                AND h.state = 'pending'
              ORDER BY h.seq
              LIMIT 1), FALSE)
          AND NOT (? AND COALESCE((
              SELECT d.seq < p.seq
              FROM {{table}} AS d FORCE INDEX ({{name:_aggregate_idx}})
              WHERE d.aggregate_type = p.aggregate_type
                AND d.aggregate_id = p.aggregate_id
                AND d.state = 'dead'
              ORDER BY d.seq
              LIMIT 1), FALSE))
        ORDER BY p.position
        LIMIT ?
    ) AS c
) AS picked
STRAIGHT_JOIN {{table}} AS o FORCE INDEX (PRIMARY) ON o.position = picked.position
SET o.claimed_by = ?, o.claimed_until = NOW(6) + INTERVAL ? MICROSECOND
WHERE o.state = 'pending'
  AND (o.claimed_until IS NULL OR o.claimed_until < NOW(6))
