-- `outbox backfill`: which of these event ids subscription table {{table}} holds (primary
-- key), in any state. $1 = ids.
SELECT id FROM {{table}} WHERE id = ANY($1)
