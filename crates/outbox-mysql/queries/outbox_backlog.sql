-- Backlog counters for metrics and `outbox status`. ? = now, ? = now, ? = now.
-- Pending and dead rows through *_pending_idx, delivered rows of the last minute through
-- *_delivered_at_idx; never the whole delivered history.
SELECT
    (SELECT COUNT(*) FROM {{table}} WHERE state = 'pending')                  AS pending,
    (SELECT COUNT(*) FROM {{table}} WHERE state = 'pending' AND attempts > 0) AS retrying,
    (SELECT COUNT(*) FROM {{table}} WHERE state = 'dead')                     AS dead,
    (SELECT TIMESTAMPDIFF(MICROSECOND, MIN(created_at), ?) FROM {{table}}
      WHERE state = 'pending' AND next_attempt_at <= ?)                       AS oldest_pending_age_us,
    (SELECT COUNT(*) FROM {{table}}
      WHERE delivered_at > ? - INTERVAL 1 MINUTE)                             AS delivered_last_minute
