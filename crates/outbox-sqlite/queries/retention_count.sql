-- Retention dry run: delivered events delivered before ?1 (Unix microseconds), and the
-- oldest delivery time among them. Reads *_delivered_at_idx.
SELECT count(*), min(delivered_at)
FROM {{table}}
WHERE state = 'delivered' AND delivered_at < ?1
