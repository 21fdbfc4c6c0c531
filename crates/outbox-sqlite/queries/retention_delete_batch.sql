-- Retention: deletes one bounded batch of delivered events delivered before ?1 (Unix
-- microseconds). ?2 = batch size. Oldest first through *_delivered_at_idx (partial:
-- state = 'delivered'); pending and dead rows are never selected, and the state test is
-- repeated in the DELETE. Each batch is one short write transaction, so the relay's settle
-- transactions (SQLite has one writer) wait at most one batch.
DELETE FROM {{table}}
WHERE seq IN (SELECT seq
              FROM {{table}}
              WHERE state = 'delivered' AND delivered_at < ?1
              ORDER BY delivered_at
              LIMIT ?2)
  AND state = 'delivered'
  AND delivered_at < ?1
