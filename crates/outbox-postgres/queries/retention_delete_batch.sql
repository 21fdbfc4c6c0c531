-- Retention (polling mode, on_delivered = "mark"): deletes one bounded batch of delivered
-- events delivered before $1. $2 = batch size. Returns the number of rows deleted.
--
-- Index *_delivered_at_idx (partial: state = 'delivered') finds the oldest delivered rows
-- first, so each batch reads only what it deletes. Pending and dead rows are never selected:
-- the state test is in the subselect and repeated in the DELETE.
--
-- Why it never fights the relay: the relay locks only pending rows (its claims), and this
-- statement touches only delivered ones. SKIP LOCKED makes two retention runs (two relay
-- replicas) split the work instead of queueing on each other, and lets an operator's
-- transaction on a delivered row (replay) win without waiting. Each batch is its own short
-- transaction: no long lock, and vacuum can reclaim the dead tuples between batches.
--
-- ctid = ANY(ARRAY(...)) is a TID scan. On a partitioned table a ctid is unique only
-- within its partition, so the DELETE repeats the full eligibility test: a row of another
-- partition that happens to share a ctid is deleted only if it is eligible too.
WITH gone AS (
    DELETE FROM {{table}}
    WHERE ctid = ANY (ARRAY(
              SELECT ctid
              FROM {{table}}
              WHERE state = 'delivered' AND delivered_at < $1
              ORDER BY delivered_at
              LIMIT $2
              FOR UPDATE SKIP LOCKED))
      AND state = 'delivered'
      AND delivered_at < $1
    RETURNING 1
)
SELECT count(*) FROM gone
