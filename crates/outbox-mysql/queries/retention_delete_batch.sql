-- Deletes one batch of delivered rows older than ?, oldest first; ? = batch size. Short
-- statements, so producers and the relay are never blocked for long.
DELETE FROM {{table}}
WHERE delivered_at < ? AND state = 'delivered'
ORDER BY delivered_at
LIMIT ?
