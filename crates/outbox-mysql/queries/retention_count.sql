-- What retention would delete: delivered before ? (through *_delivered_at_idx), and the
-- oldest such delivery.
SELECT COUNT(*), MIN(delivered_at)
FROM {{table}}
WHERE delivered_at < ?
