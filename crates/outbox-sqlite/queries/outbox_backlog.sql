-- Backlog counters for metrics and `outbox status`. ?1 = now (Unix microseconds).
-- Pending rows through *_pending_seq_idx, dead rows through *_held_idx, delivered rows of
-- the last minute through *_delivered_at_idx; never the whole delivered history.
SELECT
    (SELECT count(*) FROM {{table}} WHERE state = 'pending')                      AS pending,
    (SELECT count(*) FROM {{table}} WHERE state = 'pending' AND attempts > 0)     AS retrying,
    (SELECT count(*) FROM {{table}} WHERE state = 'dead')                         AS dead,
    (SELECT (?1 - min(created_at)) / 1000000.0 FROM {{table}}
      WHERE state = 'pending' AND next_attempt_at <= ?1)                          AS oldest_pending_age,
    (SELECT count(*) FROM {{table}}
      WHERE state = 'delivered' AND delivered_at > ?1 - 60000000)                 AS delivered_last_minute
