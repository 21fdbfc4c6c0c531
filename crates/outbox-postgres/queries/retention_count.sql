-- Retention dry run (polling mode): how many delivered events a run would delete, and the
-- oldest delivery time among them. $1 = cutoff. Reads *_delivered_at_idx.
SELECT count(*), min(delivered_at)
FROM {{table}}
WHERE state = 'delivered' AND delivered_at < $1
