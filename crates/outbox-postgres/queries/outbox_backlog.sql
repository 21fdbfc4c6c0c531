-- Backlog counters for metrics and `outbox status`. $1 = now.
-- Reads pending and dead rows through the partial indexes, and delivered rows of the last
-- minute through *_delivered_at_idx; never the whole delivered history.
SELECT
    (SELECT count(*) FROM {{table}} WHERE state = 'pending')                        AS pending,
    (SELECT count(*) FROM {{table}}
      WHERE state = 'dead' OR (state = 'pending' AND attempts > 0))                  AS held,
    (SELECT count(*) FROM {{table}} WHERE state = 'dead')                           AS dead,
    (SELECT extract(epoch FROM $1 - min(created_at))::float8 FROM {{table}}
      WHERE state = 'pending' AND next_attempt_at <= $1)                            AS oldest_pending_age,
    (SELECT count(*) FROM {{table}}
      WHERE state = 'delivered' AND delivered_at > $1 - interval '1 minute')        AS delivered_last_minute
