-- Pending events older than a threshold (backoff included: "stuck" means "not published
-- yet"), for the watchdog gauge and `outbox doctor`. Reads *_pending_seq_idx.
-- $1 = created before this time.
SELECT count(*) FROM {{table}} WHERE state = 'pending' AND created_at < $1
